"""``[logging] completions_every = N``: a table of sampled completions (prompt, reply, reward) every N steps in
the plain log, ``completions.jsonl``, TensorBoard (text), W&B (a table) and the Rich dashboard."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from ludic.cli import main
from ludic.config.schema import LoggingSection
from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.loggers.completions import BatchTap, CompletionSample, sample_items
from ludic.training.loggers.dashboard import RewardLossDashboard
from ludic.training.types import SAWBatch

from .run_configs import write_run_config

pytestmark = pytest.mark.integration


@pytest.mark.slow  # a run with every logger: ~7 s
def test_a_run_logs_its_sampled_completions_everywhere(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb_dir = tmp_path / "wb"
    wandb_dir.mkdir()
    config = write_run_config(tmp_path, model_dir, steps=2, eval_episodes=1)
    logging = "rich = false\ntensorboard = true\ncompletions_every = 2\ncompletions_count = 3"
    config.write_text(config.read_text().replace("rich = false", logging)
                      + f'[logging.wandb]\nmode = "offline"\ndir = "{wandb_dir}"\n')  # fmt: skip
    assert main(["train", str(config)]) == 0
    out = tmp_path / "out"

    rows = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 2, 2]  # every 2 steps: step 2 only, 3 samples
    for r in rows:  # the chat-templated letter-repeat prompt as text, a sampled reply, the episode's reward
        assert re.fullmatch(r"user\nRepeat [ab] 2 times\.\nassistant\n", r["prompt"]), r
        assert r["reply"] and isinstance(r["reward"], float) and 0.0 <= r["reward"] <= 1.0

    log = capsys.readouterr().out
    assert "[ludic] completions at step 2 (reward | prompt | reply):" in log
    table = log.split("completions at step 2", 1)[1].splitlines()[1:4]
    assert [line.split(" | ")[0].strip() for line in table] == [f"{r['reward']:.3f}" for r in rows]
    assert "completions at step 1" not in log

    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    (event,) = acc.Tensors("completions/text_summary")
    text = event.tensor_proto.string_val[0].decode()
    assert event.step == 2 and "| reward | prompt | reply |" in text and rows[0]["reply"].split("\n")[0] in text

    (tables,) = [list(run.rglob("completions_*.table.json")) for run in (wandb_dir / "wandb").glob("offline-run-*")]
    (wb,) = tables
    payload = json.loads(wb.read_text())
    assert payload["columns"] == ["step", "prompt", "reply", "reward"]
    assert [row[2] for row in payload["data"]] == [r["reply"] for r in rows]


def test_completions_every_zero_writes_no_table(tmp_path: Path, model_dir: Path, capsys) -> None:
    config = write_run_config(tmp_path, model_dir, steps=1, eval_episodes=1)
    config.write_text(config.read_text().replace("rich = false", "rich = false\ncompletions_every = 0"))
    assert main(["train", str(config)]) == 0
    assert not (tmp_path / "out" / "completions.jsonl").exists()
    assert "completions at step" not in capsys.readouterr().out


def test_the_logging_keys_are_checked() -> None:
    assert (LoggingSection().completions_every, LoggingSection().completions_count) == (10, 4)
    with pytest.raises(ValueError, match="completions_every must be >= 0, got -1"):
        LoggingSection(completions_every=-1)
    with pytest.raises(ValueError, match="completions_count must be >= 1, got 0"):
        LoggingSection(completions_count=0)


def _item(prompt: list[int], reply: list[int], reward: float):
    return prompt_completion_item(prompt, reply, weight=1.0, meta={"total_reward": reward})


def test_samples_take_one_reply_per_prompt_first_and_the_tap_passes_the_source_through() -> None:
    items = [_item([1, 2], [5], 1.0), _item([1, 2], [6], 0.0), _item([3], [7], 0.5), _item([3], [8], 0.0)]
    assert [i.input_ids[-1] for i in sample_items(items, 3)] == [5, 7, 6]

    class Source:
        def __init__(self) -> None:
            self.position = 0

        async def next_batch(self) -> SAWBatch:
            self.position += 1
            return SAWBatch(items=items, meta={})

        def state_dict(self) -> dict:
            return {"position": self.position}

    tap = BatchTap(Source())
    assert asyncio.run(tap.next_batch()).items == items
    assert tap.latest == items and tap.state_dict() == {"position": 1}
    assert not hasattr(tap, "load_state_dict")  # what the source lacks, the tap lacks (resume checks hasattr)


def test_the_dashboard_draws_the_latest_table() -> None:
    board = RewardLossDashboard(total_steps=4)
    board.console = Console(record=True, width=120)
    board.log_completions(3, [CompletionSample(3, "Repeat the letter b", "bb", 1.0)])
    board.log(3, {"train/loss": 0.5})
    text = board.console.export_text()
    assert "completions at step 3" in text and "Repeat the letter b" in text and "1.000" in text
