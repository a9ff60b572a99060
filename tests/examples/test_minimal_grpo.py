"""The README's minimal loop runs end to end on the embedded engine and publishes every step."""

import importlib.util
import json
import tempfile
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_grpo.py"


async def test_minimal_grpo_example_trains_two_steps(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the example's temp model goes
    (tmp_path / "tmp").mkdir()
    spec = importlib.util.spec_from_file_location("minimal_grpo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stats = await module.main(steps=2, metrics_path=tmp_path / "metrics.jsonl")
    # the temporary model directory is gone with the run (torch may leave its own inductor cache there)
    assert [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("ludic-")] == []
    assert stats["train/num_samples"] == 32.0  # 4 prompts x group of 8, one step each
    assert stats["train/target_rollouts"] == 32.0
    assert stats["train/ratio_mean"] == 1.0 or abs(stats["train/ratio_mean"] - 1.0) < 1e-3  # on-policy
    assert stats["train/mismatch_abs_mean"] < 1e-3  # engine and trainer agree on the log-probs
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[minimal_grpo]")]
    assert [line.split("  ")[0] for line in lines[:2]] == ["[minimal_grpo] step 1/2", "[minimal_grpo] step 2/2"]
    assert all(len(line) < 80 for line in lines)  # short lines, not every stat
    assert lines[2].startswith("[minimal_grpo] train reward, step 1 -> step 2: ")
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and "train/mismatch_abs_mean" in rows[0]  # every stat kept
