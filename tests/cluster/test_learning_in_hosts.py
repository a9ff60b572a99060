"""A full multi-host run learns the quickstart's task as the single-host quickstart does (issue 38).

The SFT warm start runs once on one host, as the quickstart's own (``ludic quickstart --steps 1`` leaves the
warm-started model in ``warm_start_model/``: ``[sft]`` is refused with ``[cluster]``). Then the RL part runs
in the simulated network from that model, with the quickstart's RL settings (its ``run_config.yaml``): Redis,
2 ``ludic serve`` hosts, 2 ``ludic actor`` hosts and ``torchrun`` trainer ranks on hosts of their own. The
held-out reward (the quickstart's 64 held-out prompts, temperature 1) is measured by the run's own
evaluations on ``servers[0]``, at the start and after the last step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ludic.testing.netns_roles import API_KEY_ENV, MASTER_PORT, REDIS_PASSWORD_ENV, SimulatedCluster

SEED = 0
STEPS = 300  # the quickstart's RL step count and schedule (20 warm-up steps, linear decay to 0 at the last)
# The single-host band (docs/quickstart.md): `ludic quickstart` from this very warm start (seed 0: 0.218 at the
# start of RL) ends at 0.988 after 300 steps; its 50 recorded runs (seeds 0-19 and 30 earlier ones) ended at
# 0.97-0.99 with gains of at least +0.71. The network run samples from servers one version behind
# (max_staleness 1) and trains on 2 FSDP ranks, so its numbers are not the single host's bit for bit: it is
# held to that band less a margin, at least 0.90 held-out after RL and a gain of at least +0.6.
BAND_LOW, MIN_GAIN = 0.90, 0.6


def warm_start(out: Path) -> tuple[Path, dict, float]:
    """The quickstart's SFT warm start on one host: (model folder, its RL config data, its held-out reward)."""
    argv = [sys.executable, "-m", "ludic.cli", "quickstart", "--steps", "1", "--no-live", "--seed", str(SEED),
            "--output-dir", str(out)]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = yaml.safe_load((out / "run_config.yaml").read_text())
    before = json.loads((out / "summary.json").read_text())["eval_before_rl"]
    return out / "warm_start_model", data, before


def network_config(
    run: SimulatedCluster, data: dict, model: Path, *, steps: int, trainers: list[str]
) -> Path:
    """The quickstart's RL config from ``model``, for ``steps`` steps, with ``[cluster]`` naming the hosts."""
    data = json.loads(json.dumps(data))
    data["model"]["path"] = str(model)
    data["steps"] = steps
    data["trainer"].update(warmup_steps=min(20, steps), total_steps=steps, step_in_thread=False)
    data["eval"]["every_n_steps"] = 50
    data["pipeline"] = {"max_staleness": 1, "run_id": "learn"}
    data["checkpoint"].update(output_dir=str(run.workdir / "ckpt"), every_n_steps=steps)
    data["logging"].update(output_dir=str(run.workdir / "out"), plot=False, rich=False, completions_every=0)
    data["cluster"] = {
        "servers": [run.server_url(h) for h in ("server0", "server1")],
        "redis_url": run.redis_url("redis"),
        "api_key_env": API_KEY_ENV,
        "redis_password_env": REDIS_PASSWORD_ENV,
        "trainer_nodes": len(trainers),
        "master_addr": run.net.address(trainers[0]),
        "master_port": MASTER_PORT,
    }
    path = run.workdir / "learn.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def held_out(run: SimulatedCluster, step: int) -> float:
    summary = run.workdir / "out" / "eval" / f"eval_step_{step}_summary.json"
    return json.loads(summary.read_text())["eval/avg_total_reward"]


@pytest.mark.slow
@pytest.mark.timeout(1500)  # its own bounds: the warm start 300 s, the run 900 s (300 steps: 4.5-7.5 min on a Zen 3)
def test_a_full_run_in_the_network_learns_the_quickstart_task_into_the_single_host_band(
    host_network, tmp_path: Path
) -> None:
    model, data, quickstart_before = warm_start(tmp_path / "warm")
    trainers = ["trainer0", "trainer1"]
    hosts = ["redis", "server0", "server1", "actor0", "actor1", *trainers]
    run = SimulatedCluster(host_network(hosts), tmp_path, model)
    config = network_config(run, data, model, steps=STEPS, trainers=trainers)
    started = time.monotonic()
    servers = [run.start_server(h, config, wait=False) for h in ("server0", "server1")]
    run.start_redis("redis")
    procs = run.start_trainers(trainers, config, "--fresh")
    for url in servers:
        run.wait_server("actor0", url)
    run.start_actor("actor0", config, 0)
    run.start_actor("actor1", config, 1)
    assert run.wait(procs, timeout=900) == [0] * len(trainers), run.logs()
    seconds = time.monotonic() - started
    steps = run.step_metrics()
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert all(r["perf/publish_servers_ok"] == 2.0 for r in steps)  # every step reached both servers
    before, after = held_out(run, 0), held_out(run, STEPS)
    curve = {r["step"]: round(r["eval/avg_total_reward"], 3) for r in steps if "eval/avg_total_reward" in r}
    print(f"network run ({len(trainers)} trainer hosts, {STEPS} steps, {seconds:.0f} s): held-out "
          f"{before:.3f} -> {curve} -> {after:.3f} (quickstart warm start {quickstart_before:.3f})")  # fmt: skip
    assert abs(before - quickstart_before) < 0.05  # the same warm start, the same held-out prompts and seeds
    assert after >= BAND_LOW, (before, curve, after)
    assert after - before >= MIN_GAIN, (before, curve, after)
