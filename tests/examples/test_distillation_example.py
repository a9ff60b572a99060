"""On-policy distillation end to end: a student improves on held-out prompts from teacher scores alone."""

import importlib.util
import json
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "distillation" / "distill_letter_repeat.py"


@pytest.mark.slow
def test_distilled_student_improves_held_out_reward_with_no_env_reward(tmp_path):
    spec = importlib.util.spec_from_file_location("distill_letter_repeat", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.run(tmp_path, steps=40, eval_episodes=64)
    # Measured on CPU (sampled eval, 64 episodes): teacher 0.98, student 0.13 before; after 40 steps 0.29 to
    # 0.63 depending on the training forward's layout (packed + shared, packed, padded: equal to ~1e-6, but
    # sampling amplifies the difference over a run), so the bar is a clear gain, not one run's figure.
    assert result["teacher"] >= 0.8
    assert result["student_after"] > result["student_before"] + 0.1, result
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    kl = [r["train/kl_teacher"] for r in rows]
    assert len(kl) == 40 and all(v >= 0 for v in kl)
    assert sum(kl[-5:]) < 0.7 * sum(kl[:5])  # the student moved towards the teacher (measured 0.2x)
    # the env reward was never trained on: no CISPO term, the loss is the KL alone
    assert not any(k.startswith("train/reward/") or k == "train/adv_mean" for r in rows for k in r)
