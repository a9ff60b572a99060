"""Reducers over hand-made items, on-device aggregation and the per-batch summary."""

from __future__ import annotations

import pytest
import torch

from ludic.training.stats import (
    Reducer,
    aggregate_stats,
    apply_reducers_to_records,
    batch_summary,
    default_reducers,
)
from ludic.training.types import SAWItem


def _item(rollout_id: str, n_action: int = 2, **meta: object) -> SAWItem:
    ids = [1, 2] + [3] * n_action
    return SAWItem(
        input_ids=ids,
        attention_mask=[1] * len(ids),
        action_mask=[0, 0] + [1] * n_action,
        weight=1.0,
        meta={"rollout_id": rollout_id, **meta},
    )


ITEMS = [
    _item("r1", result="win", pass_rate=0.5, completion_length=10, scores={"quality": 2.0}),
    _item("r2", result="loss", pass_rate=1.0, completion_length=20, finish_reason="length"),
    _item("r3", result="win", completion_length=30, seq_len_truncated=True, scores={"quality": 4.0}),
    _item("r4", result="draw", pass_rate=0.0, finish_reason="stop", seq_len_truncated=False),
]


def test_reducer_kinds_on_hand_made_items() -> None:
    reducers = {
        "avg_pass_rate": Reducer(kind="mean", source="pass_rate"),
        "total_tokens": Reducer(kind="sum", source="completion_length"),
        "win_rate": Reducer(
            kind="count_true", source="result", transform=lambda v: v == "win", normalize_by="rollouts"
        ),
        "win_pct": Reducer(
            kind="count_true",
            source="result",
            transform=lambda v: v == "win",
            normalize_by="samples",
            as_percent=True,
        ),
        "quality": Reducer(kind="mean", source=lambda item: item.meta.get("scores", {}).get("quality")),
    }
    out = apply_reducers_to_records(ITEMS, reducers)
    # pass_rate missing on r3 is skipped: (0.5 + 1.0 + 0.0) / 3
    assert out == {
        "avg_pass_rate": 0.5,
        "total_tokens": 60.0,
        "win_rate": 0.5,
        "win_pct": 50.0,
        "quality": 3.0,
    }


def test_dotted_source_reads_nested_meta_and_skips_missing() -> None:
    items = [_item("a", request_meta={"group_id": 3}), _item("b", request_meta={}), _item("c")]
    out = apply_reducers_to_records(items, {"gid": Reducer(kind="sum", source="request_meta.group_id")})
    assert out == {"gid": 3.0}


def test_mean_with_no_values_is_left_out() -> None:
    out = apply_reducers_to_records(ITEMS, {"nothing": Reducer(kind="mean", source="no_such_key")})
    assert out == {}


def test_rollouts_normalisation_counts_distinct_rollout_ids() -> None:
    items = [_item("r1", ok=True), _item("r1"), _item("r2", ok=False)]
    out = apply_reducers_to_records(
        items, {"ok_rate": Reducer(kind="count_true", source="ok", normalize_by="rollouts")}
    )
    assert out == {"ok_rate": 0.5}


def test_default_reducers_report_truncation_rates() -> None:
    out = apply_reducers_to_records(ITEMS, default_reducers())
    assert out == {"completion_truncated_rate": 0.25, "seq_len_truncated_rate": 0.25}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "median", "source": "x"}, "Reducer.kind must be one of"),
        ({"kind": "sum", "source": ""}, "Reducer.source must be"),
        ({"kind": "sum", "source": "x", "normalize_by": "episodes"}, "Reducer.normalize_by must be one of"),
        ({"kind": "mean", "source": "x", "normalize_by": "samples"}, "already normalised"),
    ],
)
def test_reducer_rejects_bad_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Reducer(**kwargs)


def test_aggregate_stats_weights_by_item_count_and_transfers_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real_stack = torch.stack
    monkeypatch.setattr(torch, "stack", lambda *a, **k: calls.append(1) or real_stack(*a, **k))
    out = aggregate_stats(
        [
            {"loss": torch.tensor(1.0), "ratio_mean": torch.tensor(2.0)},
            {"loss": torch.tensor(4.0), "extra": 7.0},
        ],
        weights=[3, 1],
    )
    assert out == {"loss": pytest.approx(1.75), "ratio_mean": 2.0, "extra": 7.0}
    assert len(calls) == 1


def test_aggregate_stats_rejects_mismatched_weights() -> None:
    with pytest.raises(ValueError, match="2 stat dicts but 1 weights"):
        aggregate_stats([{}, {}], [1.0])


def test_batch_summary_counts_rollouts_and_averages_per_rollout() -> None:
    items = [
        _item("r1", n_action=2, total_reward=1.0),
        _item("r1", n_action=4, total_reward=1.0),
        _item("r2", n_action=3, total_reward=0.0),
    ]
    out = batch_summary(items, {"target_rollouts": 4, "failed_rollouts": 1})
    assert out == {
        "target_rollouts": 4.0,
        "failed_rollouts": 1.0,
        "num_samples": 3.0,
        "effective_rollouts": 2.0,
        "avg_total_reward": 0.5,
        "avg_completion_length": 3.0,
    }
