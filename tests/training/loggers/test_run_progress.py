"""What a person following a run sees: elapsed time, s/step and ETA, the latest held-out evaluation, every
``time/*`` stat, plain lines when stdout is not a terminal, and a plot of the evaluations without empty panels."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

from rich.console import Console

from ludic.training.loggers.dashboard import (
    EveryNPrinter,
    RewardLossDashboard,
    make_train_logger,
    plain_every,
)
from ludic.training.loggers.plot import eval_points, plot_metrics, plot_panels
from ludic.training.loggers.run_clock import LatestEval, RunClock, fmt_duration, time_split


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_clock_gives_elapsed_seconds_per_step_and_eta() -> None:
    clock = FakeClock()
    run = RunClock(total_steps=10, clock=clock)
    assert run.parts() == ["elapsed 0s"]  # nothing logged yet: no rate, no ETA
    clock.now += 6.0
    run.tick(1)
    clock.now += 6.0
    run.tick(2)
    assert run.seconds_per_step == 6.0 and run.eta == 48.0
    assert run.parts() == ["elapsed 12s", "6.00 s/step", "ETA 48s"]


def test_a_resumed_run_counts_rate_from_its_first_logged_step() -> None:
    clock = FakeClock()
    run = RunClock(total_steps=100, clock=clock)
    clock.now += 30.0
    run.tick(41)  # resumed at step 40: one step in 30 s, not 41
    assert run.seconds_per_step == 30.0 and run.eta == 59 * 30.0


def test_durations_read_as_a_person_writes_them() -> None:
    assert [fmt_duration(s) for s in (0.4, 42, 185, 3720)] == ["0s", "42s", "3m05s", "1h02m"]


def test_every_time_stat_present_is_shown_generically() -> None:
    stats = {"time/generate_seconds": 0.812, "time/train_seconds": 0.3, "time/novel_part_seconds": 1.0,
             "time/queue_depth": 3, "train/loss": 0.1}  # fmt: skip
    assert time_split(stats) == "time: generate 0.81s, train 0.30s, novel_part 1.00s, queue_depth 3"
    assert time_split({"perf/time/generate_seconds": 2.0}) == "time: generate 2.00s"
    assert time_split({"train/loss": 1.0}) is None


def test_plain_line_shows_progress_held_out_eval_and_time_split() -> None:
    out = io.StringIO()
    printer = EveryNPrinter(every=1, prefix="[ludic]", total_steps=4, stream=out)
    with printer:
        printer.show_eval(0, {"eval/avg_total_reward": 0.125})  # the evaluation before training
        printer.log(1, {"train/avg_total_reward": 0.5, "train/loss": 0.0, "time/generate_seconds": 0.5})
        printer.log(2, {"train/avg_total_reward": 0.75, "eval/avg_total_reward": 0.25})
    first, second = out.getvalue().splitlines()
    assert first.startswith("[ludic] step 1/4 | train/avg_total_reward=0.500 | train/loss=0.000 | ")
    assert "held-out 0.125 (step 0)" in first and "s/step" in first and "ETA" in first
    assert first.endswith("time: generate 0.50s")
    assert "eval/avg_total_reward=0.250" in second and "held-out" not in second  # this step's own evaluation


def test_dashboard_shows_clock_held_out_eval_and_perf_and_time_stats() -> None:
    dash = RewardLossDashboard(total_steps=4)
    dash.console = Console(file=io.StringIO(), width=160)
    dash.show_eval(-1, {"eval/avg_total_reward": 0.0})
    dash.show_eval(0, {"eval/avg_total_reward": 0.375})
    dash.log(1, {"train/avg_total_reward": 0.5, "perf/step_seconds": 1.25, "time/generate_seconds": 0.75})
    console = Console(file=io.StringIO(), width=160, record=True)
    console.print(dash.render())
    text = console.export_text()
    assert "step 1/4" in text and "elapsed" in text and "s/step" in text and "ETA" in text
    assert "held-out 0.375 (step 0)" in text and "avg_total_reward: 0.375" in text  # the eval column too
    assert "step_seconds: 1.250" in text and "generate_seconds: 0.750" in text


def test_not_a_terminal_gets_the_plain_log_even_when_rich_is_asked(tmp_path: Path, capsys) -> None:
    logger = make_train_logger(tmp_path / "metrics.jsonl", total_steps=3, live=True)  # pytest: not a tty
    assert isinstance(logger.loggers[1], EveryNPrinter)
    with logger:
        logger.log(1, {"train/loss": 0.5})
    assert capsys.readouterr().out.startswith("[ludic] step 1/3 | train/loss=0.500")
    assert [plain_every(n) for n in (3, 100, 101, 1000)] == [1, 1, 2, 10]


def test_held_out_evaluations_come_from_the_summaries_too(tmp_path: Path) -> None:
    rows = [{"step": 5, "eval/avg_total_reward": 0.5}]
    for step, value in ((-1, 0.0), (0, 0.25), (10, 0.75)):
        (tmp_path / f"eval_step_{step}_summary.json").write_text(json.dumps({"eval/avg_total_reward": value}))
    (tmp_path / "eval_step_10.jsonl").write_text("{}\n")  # episodes, not a summary
    assert eval_points(rows, "eval/avg_total_reward", tmp_path) == ([-1, 0, 5, 10], [0.0, 0.25, 0.5, 0.75])


def _png_height(path: Path) -> int:
    return struct.unpack(">I", path.read_bytes()[20:24])[0]  # IHDR: width, height


def test_a_panel_without_information_is_left_out(tmp_path: Path) -> None:
    assert plot_panels([0.1, 0.2], [], [0.0, 0.0, 0.0]) == ["reward"]  # GRPO's loss: 0 by construction
    assert plot_panels([], [0.5], [1.0, 0.5]) == ["reward", "loss"]
    assert plot_panels([], [], []) == ["reward"]
    flat, moving = tmp_path / "flat.jsonl", tmp_path / "moving.jsonl"
    flat.write_text("".join(json.dumps({"step": s, "train/avg_total_reward": 0.1 * s, "train/loss": 0.0}) + "\n"
                            for s in range(1, 4)))  # fmt: skip
    moving.write_text(flat.read_text().replace('"train/loss": 0.0', '"train/loss": 0.5', 1))
    one, two = plot_metrics(flat, tmp_path / "one.png"), plot_metrics(moving, tmp_path / "two.png")
    assert _png_height(one) < _png_height(two)


def test_latest_eval_ignores_missing_and_non_finite_values() -> None:
    latest = LatestEval()
    latest.update(3, {"eval/avg_total_reward": float("nan")})
    assert latest.text() is None
    latest.update(4, {"eval_avg_total_reward": 0.5})  # auto-prefixed as everywhere else
    assert latest.text() == "held-out 0.500 (step 4)"
