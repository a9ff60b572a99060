"""Rejection sampling keeps only wins and writes JSONL that OfflineBatchSource turns into SAW items."""

import importlib.util
import json
from pathlib import Path

import pytest

from ludic.testing import tiny_model_path
from ludic.training.batching import OfflineBatchSource

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rejection_sampling.py"


def _load():
    spec = importlib.util.spec_from_file_location("rejection_sampling", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_only_winning_trajectories_are_kept_and_read_back_for_sft(tmp_path):
    module = _load()
    out = tmp_path / "wins.jsonl"
    counts = await _to_thread(module.main, ["--episodes", "12", "--out", str(out), "--opponent", "random"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert counts["kept"] == len(records) > 0
    assert all(r["steps"][-1]["info"]["result"] == "win" for r in records)

    source = OfflineBatchSource(out, batch_size=4, epochs=1)
    batch = await source.next_batch()
    item = batch.items[0]
    assert item.weight == 1.0  # ConstantCredit: SFT on the kept moves
    completion = [t for t, m in zip(item.input_ids, item.action_mask, strict=True) if m]
    assert completion == records[0]["steps"][0]["trace"]["completion_token_ids"]


async def test_draws_and_losses_are_rejected(tmp_path):
    module = _load()
    out = tmp_path / "wins.jsonl"
    counts = await _to_thread(module.main, ["--episodes", "8", "--out", str(out), "--opponent", "heuristic"])
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert counts["played"] == 8 and counts["kept"] == len(kept) < 8
    assert all(r["steps"][-1]["info"]["result"] == "win" for r in kept)


@pytest.mark.slow  # ~5 s of sampling
async def test_tiny_policy_samples_on_the_embedded_engine_and_keeps_only_wins(tmp_path):
    module = _load()
    out = tmp_path / "wins.jsonl"
    argv = ["--policy", "tiny", "--model", str(tiny_model_path()), "--episodes", "2", "--max-tokens", "8"]
    counts = await _to_thread(module.main, [*argv, "--out", str(out)])
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert counts["played"] == 2 and counts["kept"] == len(kept)
    assert all(r["steps"][-1]["info"]["result"] == "win" for r in kept)


async def _to_thread(fn, argv):
    import asyncio

    return await asyncio.to_thread(fn, argv)
