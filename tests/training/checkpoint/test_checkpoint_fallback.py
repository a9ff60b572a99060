"""Loading is all or nothing, and a fallback says which checkpoint it took (or refuses to skip items)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from tests.training.onpolicy import tiny_model

from ludic.training.checkpoint.manager import CheckpointLoadError, CheckpointManager
from ludic.training.config import CheckpointConfig

from .checkpointing import assert_load_refused, assert_unchanged, snapshot, trained_optimizer


def _two_checkpoints(tmp_path: Path, **cfg: object) -> tuple[CheckpointManager, dict, Path]:
    """Checkpoints at steps 1 and 2 (different weights); returns the manager, step 1's weights, step 2."""
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path / "ckpt", **cfg))
    model = tiny_model(0, layers=1)
    opt = trained_optimizer(model)
    manager.save(model, opt, step=1, metadata={"batch_source": {"last_id": "5-0", "consumed": 5}})
    first = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    second = manager.save(model, opt, step=2, metadata={"batch_source": {"last_id": "9-0", "consumed": 9}})
    return manager, first, second


@pytest.mark.parametrize("bad", ['"four"', "-1", "true", "4.0", "null"])
def test_trainer_state_with_a_bad_step_is_refused_before_weights_change(tmp_path: Path, bad: str) -> None:
    manager, _, second = _two_checkpoints(tmp_path)
    state_file = second / "trainer_state.json"
    state_file.write_text(state_file.read_text().replace('"step": 2', f'"step": {bad}'))
    assert_load_refused(manager, r"trainer_state\.json: 'step' must be an int >= 0")


def test_trainer_state_with_metadata_not_an_object_is_refused(tmp_path: Path) -> None:
    manager, _, second = _two_checkpoints(tmp_path)
    state = json.loads((second / "trainer_state.json").read_text())
    (second / "trainer_state.json").write_text(json.dumps({**state, "metadata": [1, 2]}))
    assert_load_refused(manager, "'metadata' must be a JSON object")


@pytest.mark.parametrize(
    ("latest", "message"),
    [('{"step": 2, "pa', r"latest\.json: cannot be read as JSON"),
     ('{"step": 7, "path": "step_000007"}', r"latest\.json names step_000007, which is missing")],
)  # fmt: skip
def test_unusable_latest_json_is_a_clear_error_and_falls_back(
    tmp_path: Path, latest: str, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    manager, _, second = _two_checkpoints(tmp_path, fallback_may_skip_items=True)
    (tmp_path / "ckpt" / "latest.json").write_text(latest)
    with pytest.raises(CheckpointLoadError, match=message):
        manager.load(tiny_model(1, layers=1))
    other = tiny_model(1, layers=1)
    with caplog.at_level(logging.WARNING):
        state = manager.load(other, trained_optimizer(other), fallback=True)
    assert state["step"] == 2 and state["path"] == str(second)  # the newest complete checkpoint
    assert state["fell_back_from"] == str(tmp_path / "ckpt" / "latest.json")
    assert f"fell back to the older {second} (step 2)" in caplog.text


def test_fallback_across_a_trimmed_stream_is_refused_with_the_count(tmp_path: Path) -> None:
    manager, _, second = _two_checkpoints(tmp_path)
    (second / "optimizer.pt").write_bytes(b"not a torch file")
    other = tiny_model(1, layers=1)
    other_opt = trained_optimizer(other)
    snap = snapshot(other, other_opt)
    with pytest.raises(CheckpointLoadError, match="would skip 4 pipeline items") as info:
        manager.load(other, other_opt, fallback=True)
    assert "fallback_may_skip_items = true" in str(info.value)
    assert_unchanged(other, other_opt, snap)


def test_fallback_across_a_trimmed_stream_loads_when_allowed_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager, first, second = _two_checkpoints(tmp_path, fallback_may_skip_items=True)
    (second / "optimizer.pt").write_bytes(b"not a torch file")
    other = tiny_model(1, layers=1)
    with caplog.at_level(logging.WARNING):
        state = manager.load(other, trained_optimizer(other), fallback=True)
    assert state["step"] == 1 and state["fell_back_from"] == str(second)
    assert "would skip 4 pipeline items" in caplog.text
    for key, value in other.state_dict().items():
        assert torch.equal(value, first[key]), key


def test_fallback_with_an_unreadable_newer_state_refuses_an_unknown_count(tmp_path: Path) -> None:
    manager, _, second = _two_checkpoints(tmp_path)
    (second / "trainer_state.json").write_text("{")
    with pytest.raises(CheckpointLoadError, match="would skip an unknown number of pipeline items"):
        manager.load(tiny_model(1, layers=1), fallback=True)
