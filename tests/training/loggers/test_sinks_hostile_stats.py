"""Every screen sink takes any stats dict a caller can hand it (NaN, infinities, ints too big for a float,
tensors and numpy scalars, nested dicts, long or non-string keys) without failing, and hides no number."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from ludic.training.loggers import PrintLogger, ProgressLogger, RichLiveLogger, sparkline
from ludic.training.loggers.dashboard import EveryNPrinter, RewardLossDashboard

BLOCKS = "▁▂▃▄▅▆▇█"

numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.booleans(),
)
values = st.one_of(
    numbers,
    st.none(),
    st.text(max_size=20),
    st.floats(allow_nan=True, allow_infinity=True, width=32).map(np.float32),
    st.floats(allow_nan=True, allow_infinity=True).map(torch.tensor),
    st.dictionaries(st.text(max_size=5), st.floats(), max_size=2),
)
KNOWN = ("train/avg_total_reward", "train/loss", "loss", "eval/avg_total_reward", "time/generate_seconds",
         "perf/time/train_seconds", "perf/step_seconds")  # fmt: skip
known_keys = st.sampled_from(KNOWN)
keys = st.one_of(known_keys, st.text(max_size=500), st.integers(), st.tuples(st.integers()))


def _sinks() -> list[Any]:
    dashboard = RewardLossDashboard(total_steps=10)
    dashboard.console = Console(file=io.StringIO(), width=120)
    rich = RichLiveLogger(spark_key="loss", console=Console(file=io.StringIO(), width=120))
    out = io.StringIO()
    return [PrintLogger(stream=out), ProgressLogger(stream=out, total_steps=10, clock=True),
            EveryNPrinter(1, stream=out, total_steps=10), dashboard, rich]  # fmt: skip


@given(st.lists(st.dictionaries(keys, values, max_size=6), min_size=1, max_size=3))
def test_every_screen_sink_takes_any_stats(steps: list[dict]) -> None:
    for sink in _sinks():
        for step, stats in enumerate(steps, start=1):
            sink.log(step, stats)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=30))
def test_sparkline_draws_any_floats(series: list[float]) -> None:
    line = sparkline(series)
    finite = [v for v in series if math.isfinite(v)]
    if not finite:
        assert line == ""
        return
    assert len(line) == len(series)
    assert all((c in BLOCKS) == math.isfinite(v) and (c == " ") != math.isfinite(v) for c, v in zip(line, series))
    assert line[series.index(min(finite))] == BLOCKS[0]
    if min(finite) < max(finite):
        assert line[series.index(max(finite))] == BLOCKS[-1]


def test_sparkline_spans_the_whole_float_range() -> None:
    assert sparkline([-1e308, 0.0, 1e308]) == "▁▅█"  # 1e308 - -1e308 overflows a float


def test_the_dashboard_draws_tensor_and_numpy_losses() -> None:
    dashboard = RewardLossDashboard(total_steps=3)
    dashboard.console = Console(file=io.StringIO(), width=120)
    dashboard.log(1, {"train/loss": torch.tensor(0.5)})
    dashboard.log(2, {"loss": np.float32(0.25)})
    dashboard.log(3, {"train/loss": float("nan")})
    assert list(dashboard._loss_history)[:2] == [0.5, 0.25] and math.isnan(dashboard._loss_history[2])


def test_the_plain_log_shows_a_nan_loss_instead_of_leaving_it_out() -> None:
    out = io.StringIO()
    EveryNPrinter(1, stream=out).log(1, {"train/avg_total_reward": 0.5, "train/loss": torch.tensor(float("nan"))})
    assert "train/avg_total_reward=0.500 | train/loss=nan" in out.getvalue()


def test_a_key_that_is_not_a_string_is_printed_by_name() -> None:
    out = io.StringIO()
    PrintLogger(stream=out, precision=1).log(1, {3: 0.5, "loss": 1.0})
    assert out.getvalue() == "step 1 | train/3=0.5 | train/loss=1.0\n"


def test_tensorboard_keeps_a_steps_scalars_beside_an_int_too_big_for_a_float(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ludic.training.loggers import TensorBoardLogger

    with TensorBoardLogger(tmp_path / "tb") as logger:
        logger.log(1, {"train/loss": torch.tensor(0.5), "train/count": 10**400, "train/bad": float("inf")})
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["train/loss"] and acc.Scalars("train/loss")[0].value == 0.5


def test_the_plain_log_refuses_every_below_one() -> None:
    with pytest.raises(ValueError, match=r"EveryNPrinter\.every must be >= 1, got 0"):
        EveryNPrinter(0)
