"""metrics.jsonl under unlucky input: one JSON line per step whatever the stats hold, a torn line (a killed run) that
does not swallow the next record, a file deleted mid-run written again, and a plot that reads any file a run
leaves (torn, foreign or repeated lines, bad eval summaries) naming what it left out."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ludic.training.loggers import JsonlLogger
from ludic.training.loggers.plot import eval_points, plot_metrics, read_metrics, series

PNG = b"\x89PNG\r\n\x1a\n"


def test_appending_after_a_torn_last_line_keeps_the_new_record_whole(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 0.5}\n{"step": 2, "train/lo')  # killed mid-write
    with JsonlLogger(path) as logger:
        logger.log(3, {"train/loss": 0.25})
    lines = path.read_text().split("\n")
    assert lines[1] == '{"step": 2, "train/lo'  # the cut line is left as it was
    assert json.loads(lines[2]) == {"step": 3, "train/loss": 0.25}


float_values = st.floats(allow_nan=True, allow_infinity=True)


stat_names = st.text(max_size=300).filter(lambda k: k != "train/step")  # where a stat named step goes


@given(st.dictionaries(stat_names, float_values, max_size=8))
def test_every_line_is_one_json_object_and_floats_read_back(stats: dict[str, float]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "metrics.jsonl"
        with JsonlLogger(path) as logger:
            logger.log(1, stats)
        (line,) = path.read_text(encoding="utf-8").splitlines()
    record = json.loads(line)  # NaN / Infinity as Python's json writes and reads them
    assert record["step"] == 1
    for key, value in stats.items():
        back = record["train/step" if key == "step" else key]
        assert back == value or (math.isnan(back) and math.isnan(value))


def test_tensors_numpy_and_nested_values_are_written_as_numbers(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    stats = {"a": torch.tensor(float("nan")), "b": np.float32(0.5), "c": torch.tensor([-np.inf], requires_grad=True),
             "d": {"x": torch.tensor(2.0), "y": [float("-inf")]}}  # fmt: skip
    with JsonlLogger(path) as logger:
        logger.log(1, stats)
    record = json.loads(path.read_text())  # before: "tensor(nan)" and "{'x': tensor(2.)...}" strings
    assert math.isnan(record.pop("a"))
    assert record == {"step": 1, "b": 0.5, "c": -math.inf, "d": {"x": 2.0, "y": [-math.inf]}}


def test_a_stat_named_step_does_not_replace_the_logged_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with JsonlLogger(path) as logger:
        logger.log(5, {"step": 7, "train/loss": 0.1})
    assert json.loads(path.read_text()) == {"step": 5, "train/step": 7, "train/loss": 0.1}


def test_keys_that_are_not_strings_lose_no_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with JsonlLogger(path) as logger:
        logger.log(1, {("a", 1): 1.0, 2: 2.0, "train/loss": 0.5})
    assert json.loads(path.read_text()) == {"step": 1, "('a', 1)": 1.0, "2": 2.0, "train/loss": 0.5}


def test_a_metrics_file_deleted_while_the_run_logs_is_written_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "out" / "metrics.jsonl"
    with JsonlLogger(path) as logger, caplog.at_level(logging.WARNING):
        logger.log(1, {"train/loss": 1.0})
        path.unlink()
        path.parent.rmdir()  # the whole folder, as `rm -rf out` does
        logger.log(2, {"train/loss": 0.5})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [2]
    assert f"{path} was deleted while the run logged" in caplog.text


def test_plot_leaves_out_lines_it_cannot_use_naming_the_file_and_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 1, "train/avg_total_reward": 0.1, "train/loss": 1.0}\n'
        "\n"
        '{"step": 2, "train/lo{"step": 3, "train/avg_total_reward": 0.3}\n'  # a torn line glued to the next
        "[1, 2]\n"
        '{"train/loss": 5.0}\n'
        '{"step": "4", "train/loss": 5.0}\n'
        '{"step": 5, "train/avg_total_reward": 0.5, "train/loss": 0.5}\n'
        '{"step": 6, "train/lo'  # killed mid-write
    )
    with caplog.at_level(logging.WARNING):
        rows = read_metrics(path)
        png = plot_metrics(path, tmp_path / "curve.png")
    assert [row["step"] for row in rows] == [1, 5]
    assert png.read_bytes()[:8] == PNG
    assert f"{path}: 5 line(s) left out of the plot: line 3: not JSON" in caplog.text
    assert "line 4: a JSON list, not an object" in caplog.text
    assert "line 5: no integer 'step' (got None)" in caplog.text and "line 6: no integer 'step' (got '4')" in caplog.text


def test_plot_leaves_out_eval_summaries_it_cannot_read_naming_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics, evals = tmp_path / "metrics.jsonl", tmp_path / "eval"
    metrics.write_text('{"step": 1, "train/avg_total_reward": 0.5}\n')
    evals.mkdir()
    (evals / "eval_step_-1_summary.json").write_text("")  # killed while the evaluator wrote it
    (evals / "eval_step_0_summary.json").write_text("[0.25]")
    (evals / "eval_step_1_summary.json").write_text('{"eval/avg_total_reward": true}')
    (evals / "eval_step_2_summary.json").write_text('{"eval/avg_total_reward": 0.75}')
    with caplog.at_level(logging.WARNING):
        assert eval_points([], "eval/avg_total_reward", evals) == ([2], [0.75])
        assert plot_metrics(metrics, tmp_path / "curve.png", eval_dir=evals).read_bytes()[:8] == PNG
    assert f"{evals / 'eval_step_-1_summary.json'}: left out of the plot, not a readable evaluation summary" in caplog.text
    assert f"{evals / 'eval_step_0_summary.json'}: left out of the plot, a JSON list, not an evaluation summary (an object)" in caplog.text


def test_a_step_logged_again_keeps_its_latest_value_and_steps_stay_in_order() -> None:
    rows = [{"step": s, "train/loss": float(s)} for s in (1, 2, 3)]
    rows += [{"step": s, "train/loss": 10.0 * s} for s in (2, 3, 4)]  # resumed from step 1's checkpoint
    rows.append({"step": 4, "eval/avg_total_reward": 0.5})  # another record of step 4: no loss
    assert series(rows, "train/loss") == ([1, 2, 3, 4], [1.0, 20.0, 30.0, 40.0])


hostile_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.lists(st.floats(), max_size=2),
)
hostile_rows = st.lists(
    st.fixed_dictionaries(
        {"step": st.integers(min_value=-3, max_value=30)},
        optional={key: hostile_values for key in ("train/avg_total_reward", "train/loss", "eval/avg_total_reward")},
    ),
    max_size=12,
)


@given(hostile_rows)
def test_series_are_finite_floats_by_unique_step_whatever_the_rows(rows: list[dict]) -> None:
    for key in ("train/avg_total_reward", "train/loss"):
        steps, values = series(rows, key)
        assert steps == sorted(set(steps)) and len(values) == len(steps)
        assert all(type(v) is float and math.isfinite(v) for v in values)


def test_plot_draws_any_file_a_run_can_leave(tmp_path: Path) -> None:
    """A few hostile files through the real matplotlib backend (a hypothesis run of plots would take minutes)."""
    cases = {
        "empty": [],
        "one point": [{"step": 1, "train/avg_total_reward": 0.5, "train/loss": 0.1}],
        "all NaN": [{"step": s, "train/avg_total_reward": math.nan, "train/loss": math.inf} for s in range(4)],
        "constant": [{"step": s, "train/avg_total_reward": 2.0, "train/loss": 2.0} for s in range(4)],
        "huge ints": [{"step": s, "train/avg_total_reward": 10**400, "train/loss": -(10**400)} for s in range(4)],
        "repeated": [{"step": s % 3, "train/avg_total_reward": 0.1 * s, "train/loss": s} for s in range(7)],
    }
    for name, rows in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        assert plot_metrics(path, tmp_path / f"{name}.png").read_bytes()[:8] == PNG, name
