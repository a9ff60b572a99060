"""examples/lora: the next-letter task trained with LoRA and adapter publishes runs, and gains (slow)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lora" / "next_letter_lora.py"


def _load():
    sys.path.insert(0, str(EXAMPLE.parents[1] / "tutorial"))
    spec = importlib.util.spec_from_file_location("next_letter_lora", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_lora_example_smoke_publishes_adapters_only(tmp_path: Path) -> None:
    report = await _load().main("lora", steps=2, sft_steps=2, seed=0, out=tmp_path, eval_episodes=8)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert 0 < report["publish_bytes"] < 0.15 * 3.4e6  # the adapter (0.31 MB), not the 3.4 MB model


@pytest.mark.slow
async def test_lora_example_gains_held_out_reward(tmp_path: Path) -> None:
    report = await _load().main("lora", steps=150, sft_steps=40, seed=0, out=tmp_path)
    assert report["end"] - report["start_of_rl"] >= 0.15  # measured +0.25 (full weights: +0.33)
