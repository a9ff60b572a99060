"""The trainer role of a multi-host run: ``torchrun --nproc_per_node 2 -m ludic.cli train CONFIG`` with
``[cluster]`` (gloo on CPU, a tiny model, loopback), against a real Redis (password from the environment),
one real Ludic server (bearer token from the environment) and a ``ludic actor`` process writing the stream. Both ranks
step, rank 0 alone reads the stream and publishes (the server serves each step's version), a DCP checkpoint is
written, and ``torchrun --nproc_per_node 1`` resumes from it (DCP reshards 2 -> 1) and finishes the run.
Plus the startup refusals of what cannot work under torchrun or with ``[cluster]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ludic.cli.distributed_run import distributed_errors
from ludic.config import load_config
from ludic.testing import build_tiny_model, torchrun_argv
from ludic.testing.run_config import tiny_run_toml
from ludic.testing.server_process import start_server, stop_server
from ludic.training.pipeline.redis_server import RedisServer

TOKEN = "trainer-role-token"


def _config(tmp: Path, model: Path, *, steps: int, server: str, redis_port: int) -> Path:
    text = tiny_run_toml(
        model,
        steps=steps,
        tables=f"""
[eval]
num_episodes = 2
sampling = {{ temperature = 0.0, max_tokens = 4 }}
[trainer]
lr = 1e-3
max_seq_len = 128
micro_token_budget = 1024
[pipeline]
max_staleness = 2
run_id = "role"
[checkpoint]
output_dir = "{tmp / "ckpt"}"
every_n_steps = 1
[logging]
output_dir = "{tmp / "out"}"
rich = false
plot = false
[cluster]
servers = ["{server}"]
redis_url = "redis://127.0.0.1:{redis_port}/0"
api_key_env = "ROLE_TEST_KEY"
redis_password_env = "ROLE_TEST_REDIS_PASSWORD"
trainer_procs_per_node = 2
""",
    )
    path = tmp / "run.toml"
    path.write_text(text)
    return path


def _torchrun(config: Path, nproc: int, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    from ludic.inference.weight_sync.process_group import free_port

    cmd = torchrun_argv(config.parent / "torchrun", "--nnodes", "1", "--nproc_per_node", str(nproc),
                        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "-m", "ludic.cli", "train",
                        str(config), *extra)  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _version(url: str) -> int:
    reply = httpx.get(url + "/policy_version", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    return int(reply.json()["policy_version"])


@pytest.mark.slow
def test_two_rank_trainer_reads_the_stream_on_rank0_publishes_checkpoints_and_resumes_on_one_rank(tmp_path):
    model = build_tiny_model(tmp_path / "model", seed=0)
    redis = RedisServer(data_dir=tmp_path / "redis").start()
    server_proc, server = start_server(model, "--api-key", TOKEN)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ROLE_TEST_KEY": TOKEN,
        "ROLE_TEST_REDIS_PASSWORD": redis.password,
    }
    config = _config(tmp_path, model, steps=2, server=server, redis_port=redis.port)
    actor_log = (tmp_path / "actor.log").open("w")
    actor = subprocess.Popen([sys.executable, "-m", "ludic.cli", "actor", str(config), "--actor-id", "0"], env=env,
                             stdout=actor_log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        first = _torchrun(config, 2, env, "--fresh")
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-6000:]
        assert _version(server) == 2  # rank 0 published each step's weights to the server
        records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if "train/loss" in r]
        assert [r["step"] for r in steps] == [1, 2]
        for r in steps:  # both ranks trained a share of each step's batch
            assert r["perf/rank0/real_tokens"] > 0 and r["perf/rank1/real_tokens"] > 0
            assert r["perf/publish_servers_ok"] == 1.0
        state = json.loads((tmp_path / "ckpt" / "step_000002" / "trainer_state.json").read_text())
        assert state["world_size"] == 2 and state["step"] == 2 and state["format"] == "dcp-safetensors"
        assert state["metadata"]["batch_source"]["consumed"] == 8  # rank 0's stream cursor: 2 steps x 4 items
        assert (tmp_path / "out" / "final_model" / "model.safetensors").is_file()
        assert first.stdout.count("step 2/2") <= 1  # one progress line: rank 0 alone logs

        config.write_text(config.read_text().replace("steps = 2", "steps = 3", 1))
        again = _torchrun(config, 1, env)  # a host lost: the same run on fewer ranks, from the checkpoint
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[:8000]
        assert "resuming at step 2 of 3" in again.stdout
        assert _version(server) == 3
        records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3]
        state = json.loads((tmp_path / "ckpt" / "step_000003" / "trainer_state.json").read_text())
        assert state["world_size"] == 1 and state["step"] == 3
        assert state["metadata"]["batch_source"]["consumed"] == 12  # the cursor came back from the checkpoint
    finally:
        actor.terminate()
        actor.wait(timeout=30)
        actor_log.close()
        stop_server(server_proc)
        redis.stop()


@pytest.mark.slow
def test_one_process_trainer_with_a_cluster_publishes_every_step_to_both_servers(tmp_path):
    """Plain ``ludic train`` (no torchrun) with ``[cluster]`` naming two servers: pipeline mode on the cluster's
    Redis, no actor task of its own (the stream is fed by a ``ludic actor`` process), and every step's weights
    on both servers."""
    model = build_tiny_model(tmp_path / "model", seed=0)
    redis = RedisServer(data_dir=tmp_path / "redis").start()
    servers = [start_server(model, "--api-key", TOKEN) for _ in range(2)]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ROLE_TEST_KEY": TOKEN,
        "ROLE_TEST_REDIS_PASSWORD": redis.password,
    }
    env = {k: v for k, v in env.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    config = _config(tmp_path, model, steps=2, server=servers[0][1], redis_port=redis.port)
    config.write_text(config.read_text().replace(f'servers = ["{servers[0][1]}"]',
                                                 f'servers = ["{servers[0][1]}", "{servers[1][1]}"]'))  # fmt: skip
    actor = subprocess.Popen([sys.executable, "-m", "ludic.cli", "actor", str(config), "--actor-id", "0"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        done = subprocess.run([sys.executable, "-m", "ludic.cli", "train", str(config)], env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
        assert [_version(url) for _, url in servers] == [2, 2]
        records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if "train/loss" in r]
        assert [r["step"] for r in steps] == [1, 2]
        assert all(
            r["perf/publish_servers_ok"] == 2.0 and r["perf/publish_servers_failed"] == 0.0 for r in steps
        )
    finally:
        actor.terminate()
        actor.wait(timeout=30)
        for proc, _ in servers:
            stop_server(proc)
        redis.stop()


@pytest.mark.slow
def test_two_rank_trainer_without_a_cluster_generates_on_rank0_against_one_server(tmp_path):
    """The same command on a one-host config: [inference].backend = "server", no pipeline; rank 0 alone builds the
    client and engine, generates each step's batch and publishes; both ranks train their share of it."""
    model = build_tiny_model(tmp_path / "model", seed=0)
    server_proc, server = start_server(model)
    text = tiny_run_toml(
        model,
        steps=2,
        tables=f"""
[inference]
backend = "server"
server_url = "{server}"
[eval]
num_episodes = 2
sampling = {{ temperature = 0.0, max_tokens = 4 }}
[trainer]
max_seq_len = 128
micro_token_budget = 1024
[checkpoint]
output_dir = "{tmp_path / "ckpt"}"
every_n_steps = 2
[logging]
output_dir = "{tmp_path / "out"}"
rich = false
plot = false
""",
    )
    config = tmp_path / "run.toml"
    config.write_text(text)
    try:
        done = _torchrun(config, 2, {**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[:8000]
        assert int(httpx.get(server + "/policy_version", timeout=10).json()["policy_version"]) == 2
        records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if "train/loss" in r]
        assert [r["step"] for r in steps] == [1, 2]
        assert all(r["perf/rank0/real_tokens"] > 0 and r["perf/rank1/real_tokens"] > 0 for r in steps)
        state = json.loads((tmp_path / "ckpt" / "step_000002" / "trainer_state.json").read_text())
        assert state["world_size"] == 2 and state["format"] == "dcp-safetensors"
        assert (tmp_path / "out" / "eval" / "eval_step_2_summary.json").is_file()  # rank 0's final evaluation
    finally:
        stop_server(server_proc)


def test_what_cannot_work_under_torchrun_or_with_a_cluster_is_refused_with_the_reason(tmp_path):
    model = tmp_path / "m"  # never loaded: the checks read the config alone
    base = _config(tmp_path, model, steps=1, server="http://127.0.0.1:1", redis_port=6379).read_text()
    path = tmp_path / "bad.toml"
    path.write_text(base.replace("[pipeline]", '[sft]\ndemonstrations = "d.jsonl"\nsteps = 1\n[pipeline]\nactors = 2\n'
                                 'redis_url = "redis://127.0.0.1:1/0"', 1))  # fmt: skip
    errors = "\n".join(distributed_errors(load_config(path), world=2))
    assert "[pipeline].redis_url is set with [cluster]" in errors
    assert "[pipeline].actors = 2 with [cluster]" in errors and "ludic actor" in errors
    assert "[sft] with [cluster]" in errors
    single = tmp_path / "single.toml"
    single.write_text(tiny_run_toml(model, steps=1, tables="[lora]\nrank = 4\n"))
    errors = "\n".join(distributed_errors(load_config(single), world=2))
    assert "'embedded' under torchrun (WORLD_SIZE=2)" in errors and "[lora] under torchrun" in errors
    assert distributed_errors(load_config(single), world=1) == []


async def test_with_a_cluster_the_trainer_starts_no_actor_tasks_of_its_own(tmp_path):
    """``[cluster]``'s actors are ``ludic actor`` processes on their own hosts; ``[pipeline].actors`` (1 by default)
    is what a one-host pipeline run starts beside its trainer."""
    from ludic.cli.pipeline_mode import running_actors

    cfg = load_config(
        _config(tmp_path, tmp_path / "m", steps=1, server="http://127.0.0.1:1", redis_port=6379)
    )
    assert cfg.pipeline.actors == 1
    asked = []
    async with running_actors(cfg, None, None, asked.append) as tasks:
        assert tasks == [] and asked == []
