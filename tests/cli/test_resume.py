"""``ludic train`` resumes from its latest checkpoint exactly; ``--fresh`` starts over and says so."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from ludic.cli import main
from ludic.cli.run_config import train_from_config
from ludic.config import load_config

from .run_configs import write_run_config

pytestmark = pytest.mark.integration


def _config(folder: Path, model: Path, *, steps: int, every: int = 5) -> Path:
    checkpoint = f"[checkpoint]\nevery_n_steps = {every}\nmax_to_keep = 2\n"
    return write_run_config(folder, model, steps=steps, eval_episodes=1, lr=3e-3, tables=checkpoint)


def _final_weights(folder: Path) -> dict:
    return load_file(str(folder / "out" / "final_model" / "model.safetensors"))


def _metric_steps(folder: Path) -> list[int]:
    lines = (folder / "out" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] - b[key]).abs().max().item() == 0.0, key


@pytest.mark.slow  # three runs of 10-20 steps: ~5 s
def test_ten_plus_ten_resumed_steps_equal_twenty_straight(tmp_path: Path, model_dir: Path) -> None:
    train_from_config(load_config(_config(tmp_path / "straight", model_dir, steps=20)))
    split = tmp_path / "split"
    train_from_config(load_config(_config(split, model_dir, steps=10)))
    assert _metric_steps(split) == list(range(1, 11))
    cfg = load_config(_config(split, model_dir, steps=20))
    state = json.loads((split / "out" / "checkpoints" / "step_000010" / "trainer_state.json").read_text())
    assert state["metadata"]["batch_source"] == {
        "request_fn": {"next_seed": 20},
        "request_strategy": {"groups_made": 20},  # groups formed by the batch source (algorithm's size)
    }
    train_from_config(cfg)
    assert _metric_steps(split) == list(range(1, 21))
    _assert_same_weights(_final_weights(tmp_path / "straight"), _final_weights(split))


def test_resume_drops_metrics_of_steps_after_the_checkpoint(tmp_path: Path, model_dir: Path) -> None:
    cfg_path = _config(tmp_path, model_dir, steps=4, every=2)
    train_from_config(load_config(cfg_path))
    metrics = tmp_path / "out" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines) + "\n" + lines[-1].replace('"step": 4', '"step": 5') + '\n{"step": 6, "tr')
    (tmp_path / "out" / "checkpoints" / "step_000004").rename(tmp_path / "out" / "checkpoints" / "x")
    (tmp_path / "out" / "checkpoints" / "latest.json").write_text('{"step": 2, "path": "step_000002"}')
    train_from_config(load_config(_config(tmp_path, model_dir, steps=5, every=2)))
    assert _metric_steps(tmp_path) == [1, 2, 3, 4, 5]


def test_a_kill_between_the_checkpoint_and_its_log_line_loses_no_record(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", str(_config(tmp_path, model_dir, steps=5, every=2))]) == 0
    metrics, checkpoints = tmp_path / "out" / "metrics.jsonl", tmp_path / "out" / "checkpoints"
    lines = metrics.read_text().splitlines()
    logged = json.loads(lines[3])
    # as if killed while writing step 4's line, just after step 4's checkpoint: step 5 never happened
    metrics.write_text("\n".join(lines[:3]) + '\n{"step": 4, "train/lo')
    shutil.rmtree(checkpoints / "step_000005")
    (checkpoints / "latest.json").write_text('{"step": 4, "path": "step_000004"}')
    capsys.readouterr()
    assert main(["train", str(_config(tmp_path, model_dir, steps=6, every=2))]) == 0
    said = capsys.readouterr().out
    assert "resuming at step 4 of 6" in said and "step 4's record restored from the checkpoint" in said
    assert _metric_steps(tmp_path) == [1, 2, 3, 4, 5, 6]
    restored = json.loads(metrics.read_text().splitlines()[3])
    trained = {k: v for k, v in logged.items() if k.startswith("train/")}
    assert trained and {k: restored[k] for k in trained} == trained  # the step's own stats, not a later step's
    assert not any(k.startswith("time/") for k in restored)  # the split was still running when it saved


def test_the_end_reuses_the_last_steps_checkpoint_and_writes_one_when_there_is_none(
    tmp_path: Path, model_dir: Path
) -> None:
    def state(folder: Path, step: int) -> dict:
        return json.loads((folder / "out" / "checkpoints" / f"step_{step:06d}" / "trainer_state.json").read_text())

    train_from_config(load_config(_config(tmp_path / "even", model_dir, steps=4, every=2)))
    assert "stats" in state(tmp_path / "even", 4)["metadata"]  # step 4's own save, not rewritten by the end
    train_from_config(load_config(_config(tmp_path / "odd", model_dir, steps=5, every=2)))
    assert "stats" not in state(tmp_path / "odd", 5)["metadata"]  # no step wrote 5: the end did
    assert json.loads((tmp_path / "odd" / "out" / "checkpoints" / "latest.json").read_text())["step"] == 5


def test_leftover_metrics_without_a_checkpoint_need_fresh(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg_path = _config(tmp_path, model_dir, steps=2, every=0)
    assert main(["train", str(cfg_path)]) == 0  # an earlier run; then its checkpoints are gone
    shutil.rmtree(tmp_path / "out" / "checkpoints")
    capsys.readouterr()
    assert main(["train", str(cfg_path)]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl holds an earlier run's metrics and there is no checkpoint to resume from" in err
    assert "pass --fresh" in err and "metrics.jsonl (2 records)" in err

    assert main(["train", str(cfg_path), "--fresh"]) == 0
    said = capsys.readouterr().out
    assert "ludic train --fresh: starting over; removed" in said and str(tmp_path / "out" / "metrics.jsonl") in said
    assert _metric_steps(tmp_path) == [1, 2]


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_gives_the_straight_run(tmp_path: Path, model_dir: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "ludic.cli", "train"]
    straight = _config(tmp_path / "straight", model_dir, steps=12, every=2)
    subprocess.run([*cmd, str(straight)], check=True, env=env, capture_output=True, timeout=300)

    killed = _config(tmp_path / "killed", model_dir, steps=12, every=2)
    proc = subprocess.Popen([*cmd, str(killed)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    latest = tmp_path / "killed" / "out" / "checkpoints" / "latest.json"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if latest.is_file() and json.loads(latest.read_text())["step"] >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert json.loads(latest.read_text())["step"] < 12

    rerun = subprocess.run([*cmd, str(killed)], env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "ludic train: resuming at step" in rerun.stdout
    assert _metric_steps(tmp_path / "killed") == list(range(1, 13))
    _assert_same_weights(_final_weights(tmp_path / "straight"), _final_weights(tmp_path / "killed"))
