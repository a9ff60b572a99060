"""The quickstart dashboard shows reward and loss sparklines; the JSONL gets every step."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from ludic.training.loggers.dashboard import EveryNPrinter, RewardLossDashboard, make_train_logger


def test_dashboard_renders_reward_and_loss_sparklines() -> None:
    dash = RewardLossDashboard(total_steps=4)
    dash.console = Console(file=io.StringIO(), width=100, record=True)
    for step, (reward, loss) in enumerate([(0.0, 3.0), (0.5, 2.0), (1.0, 1.0)], start=1):
        dash.log(step, {"train/avg_total_reward": reward, "train/loss": loss})
    console = Console(file=io.StringIO(), width=100, record=True)
    console.print(dash.render())
    text = console.export_text()
    assert "step 3/4" in text
    assert "train/avg_total_reward" in text and "train/loss" in text
    assert "▁▅█  1.000" in text  # reward rising
    assert "█▅▁  1.000" in text  # loss falling


def test_every_n_printer_prints_every_nth_step_and_eval_steps(capsys) -> None:
    printer = EveryNPrinter(every=2, prefix="[quickstart]")
    for step in range(1, 5):
        printer.log(step, {"train/loss": 1.0, "train/avg_total_reward": 0.5, "train/other": 9})
    printer.log(5, {"eval/avg_total_reward": 0.75})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        "[quickstart] step 2",
        "[quickstart] step 4",
        "[quickstart] step 5",
    ]
    assert "train/other" not in lines[0]
    assert "eval/avg_total_reward=0.750" in lines[2]


def test_train_logger_writes_jsonl(tmp_path: Path) -> None:
    logger = make_train_logger(tmp_path / "m" / "metrics.jsonl", total_steps=2, live=False)
    with logger:
        logger.log(1, {"train/loss": 0.5})
        logger.log(2, {"train/loss": 0.25})
    rows = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "train/loss": 0.5}, {"step": 2, "train/loss": 0.25}]
