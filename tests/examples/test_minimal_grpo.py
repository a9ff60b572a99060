"""The README's minimal loop runs end to end on the embedded engine and publishes every step."""

import importlib.util
import tempfile
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_grpo.py"


async def test_minimal_grpo_example_trains_two_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the example's temp model goes
    spec = importlib.util.spec_from_file_location("minimal_grpo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stats = await module.main(steps=2)
    assert list(tmp_path.iterdir()) == []  # the temporary model directory is gone with the run
    assert stats["train/num_samples"] == 32.0  # 4 prompts x group of 8, one step each
    assert stats["train/target_rollouts"] == 32.0
    assert stats["train/ratio_mean"] == 1.0 or abs(stats["train/ratio_mean"] - 1.0) < 1e-3  # on-policy
    assert stats["train/mismatch_abs_mean"] < 1e-3  # engine and trainer agree on the log-probs
