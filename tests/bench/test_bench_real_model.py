"""bench/bench_real_model.py runs end to end in its smallest form (one step, quick knobs) on a tiny model:
both sides train, the engine and ``generate`` decode, two busy processes are started and stopped, and the
summary holds every figure the lead reads (the numbers themselves mean nothing on a tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_real_model.py"


@pytest.mark.slow
def test_the_smallest_form_runs_on_a_tiny_model_and_reports_every_figure(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("reasoning_gym")
    from ludic.testing import build_tiny_model

    model = build_tiny_model(tmp_path / "model")
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(BENCH), str(model), "--steps", "1", "--quick", "--rounds", "1", "--out", str(out),
           "--reward-steps", "1"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    for key in ("ludic_step_s", "trl_step_s", "speedup_vs_trl", "matmul_gflops", "step_over_floor",
                "ludic_contention_slowdown", "trl_contention_slowdown", "ludic_peak_rss_mb", "trl_peak_rss_mb",
                "memory_bound_mb", "rss_over_bound", "decode_matmul_gflops", "step_over_floor_at_decode_rate"):  # fmt: skip
        assert summary[key] > 0, key
    split = summary["ludic_time_split_s"]
    parts = sum(v for k, v in split.items() if k != "time/step_seconds")
    assert split["time/generate_seconds"] > 0 and parts == pytest.approx(split["time/step_seconds"], rel=0.1)
    assert summary["engine_vs_generate"]["ratio"] > 0 and summary["floor_s"]["total"] > 0
    reward = summary["held_out_reward_after_equal_steps"]  # each side trained once more, then scored alike
    assert reward["steps"] == 1 and reward["held_out_questions"] > 0
    assert all(0.0 <= reward[side] <= 1.0 for side in ("before", "ludic", "trl"))
    for side in ("ludic", "trl"):  # the trained folders the evaluator loaded are each side's own weights
        assert (out / f"reward_{side}" / "final" / "model.safetensors").is_file()


def test_a_missing_model_folder_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    done = subprocess.run([sys.executable, str(BENCH), str(missing), "--quick"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and str(missing) in done.stderr and "ludic models pull" in done.stderr


def test_the_memory_bound_and_its_ratio_are_issue_35s_arithmetic() -> None:
    sys.path.insert(0, str(BENCH.parent))
    from argparse import Namespace

    from bench_real_model import memory_bound_mb, report, step_floor_s

    params = 134_515_008  # SmolLM2-135M: 538 MB of fp32 weights
    assert memory_bound_mb(params) == pytest.approx(5 * 4 * params / 2**20 + 1024)  # ~3,590 MiB
    assert 3550 < memory_bound_mb(params) < 3600
    assert step_floor_s(params, 1900, 2048, 300.0) == pytest.approx((6 * params * 1900 + 2 * params * 2048) / 300e9)
    # each step against its own floor, at the rate measured around it: a machine that slowed between steps
    # (the second step's rate 200 against the first's 300) moves the floor with the step
    floors = [step_floor_s(params, 1900, 2048, 300.0), step_floor_s(params, 1900, 2048, 200.0)]
    run = {"step_seconds": [10.0, 12.0], "split": {"time/step_seconds": 11.0}, "trained_tokens": 1900.0,
           "generated_tokens": 2048.0, "params": params, "rss_mb": 4000.0, "step_gflops": [300.0, 200.0],
           "step_floor_s": floors}  # fmt: skip
    results = {"quiet": {"ludic": [run, {**run, "rss_mb": 6000.0}]}, "busy": {"ludic": []},
               "engine": {"gflops": 300.0, "decode_gflops": 150.0, "engine_tok_s": 1.0, "generate_tok_s": 1.0,
                          "ratio": 1.0, "ratios": [0.5, 1.0, 2.0]}}  # fmt: skip
    summary = report(results, Namespace(recompute_head_logits=False))
    assert summary["engine_vs_generate"]["ratios"] == [0.5, 1.0, 2.0]  # every round's, beside the median
    assert summary["ludic_peak_rss_mb"] == 6000.0  # the largest peak of the runs
    assert summary["rss_over_bound"] == pytest.approx(6000.0 / memory_bound_mb(params))
    ratios = [10.0 / floors[0], 12.0 / floors[1]] * 2
    assert summary["step_over_floor_per_step"] == pytest.approx(ratios)
    assert summary["step_over_floor"] == pytest.approx((10.0 / floors[0] + 12.0 / floors[1]) / 2)  # the median
    assert summary["matmul_gflops"] == pytest.approx(250.0)  # the median of the steps' rates
    assert summary["engine_worker_matmul_gflops"] == 300.0
    assert summary["floor_s"]["train"] == pytest.approx(6 * params * 1900 / 250e9)
    # the floor again with generation at the decoding batch's own matmul rate
    assert summary["floor_at_decode_rate_s"]["generate"] == pytest.approx(2 * params * 2048 / 150e9)
    assert summary["step_over_floor_at_decode_rate"] == pytest.approx(11.0 / (6 * params * 1900 / 250e9 + 2 * params * 2048 / 150e9))


def test_ludic_s_side_keeps_the_head_logits_unless_asked_to_recompute_them(tmp_path: Path) -> None:
    sys.path.insert(0, str(BENCH.parent))
    from bench_real_model import FULL, ludic_config

    from ludic.quickstart.run_config import to_run_config

    for keep in (True, False):
        run = to_run_config(ludic_config("model-folder", 3, FULL, tmp_path, keep_head_logits=keep))
        assert run.trainer.keep_head_logits is keep  # the TrainerConfig the run builds
    done = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=120)
    assert "--recompute-head-logits" in done.stdout
