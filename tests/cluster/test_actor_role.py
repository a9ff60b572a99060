"""``ludic actor`` as a real process: two real Ludic servers (bearer token), a real Redis (password), the
stream read back by the trainer's own ``PipelineBatchSource`` or decoded entry by entry."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from ludic.cli.pipeline_mode import ACTOR_SEED_STRIDE
from ludic.testing.run_config import tiny_run_toml
from ludic.testing.server_process import start_servers, stop_server
from ludic.testing.tiny_model import tiny_model_path
from ludic.training.pipeline import PipelineBatchSource
from ludic.training.pipeline.codec import decode_entry
from ludic.training.pipeline.redis_server import RedisServer

KEY, PASSWORD = "actor-test-token", "actor-test-redis-pw"
ENV = {"T_LUDIC_KEY": KEY, "T_REDIS_PW": PASSWORD}
VOCAB = 259  # the tiny model's byte-level vocabulary


def _servers(n: int) -> tuple[list, list[str]]:
    return start_servers(tiny_model_path(), n, "--api-key", KEY)  # the model built here, once


@pytest.fixture(scope="module")
def servers() -> Iterator[list[str]]:
    procs, urls = _servers(2)
    try:
        yield urls
    finally:
        for p in procs:
            stop_server(p)


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD) as server:
        yield server


def _config(tmp: Path, urls: list[str], redis: RedisServer, run_id: str, *, tasks: int = 1, tables: str = "",
            multi_turn: bool = False) -> Path:  # fmt: skip
    env = '[env]\nname = "tic_tac_toe"\n[harness]\nname = "xml_move"\n' if multi_turn else ""
    text = tiny_run_toml(
        tiny_model_path(),
        steps=1,
        tables=f"""
[cluster]
servers = [{", ".join(f'"{u}"' for u in urls)}]
redis_url = "redis://127.0.0.1:{redis.port}/0"
api_key_env = "T_LUDIC_KEY"
redis_password_env = "T_REDIS_PW"
actor_tasks = {tasks}
[pipeline]
run_id = "{run_id}"
{tables}""",
    )
    if multi_turn:  # the tiny model never writes <move>: 3 parse-error turns per episode, 3 model calls
        text = text.replace('[env]\nname = "letter_repeat"\nkwargs = { count = 2, letters = "ab" }\n', env)
        text = text.replace("[rollout]\n", "[rollout]\nmax_steps = 3\n")
    path = tmp / "cluster.toml"
    path.write_text(text)
    return path


def _actor(config: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, **ENV, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "ludic.cli", "actor", str(config), *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_line(proc: subprocess.Popen, needle: str, timeout_s: float = 120) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    proc.kill()
    raise AssertionError(f"no {needle!r} line: {lines} {proc.stderr.read()[-2000:]}")


def _entries(redis: RedisServer, run_id: str) -> list:
    import redis as redis_py

    client = redis_py.Redis(host="127.0.0.1", port=redis.port, password=PASSWORD)
    raw = client.xrange(f"ludic:pipeline:{run_id}:items")
    client.close()
    return [decode_entry(fields, run_id=run_id).item for _, fields in raw]


def _assert_whole(items: list, *, group_size: int, steps: int) -> None:
    """Every GRPO group complete, every rollout whole (steps 0..steps-1, the last one ending it)."""
    rollouts: dict[str, list] = defaultdict(list)
    for item in items:
        rollouts[item.meta["rollout_id"]].append(item.meta)
    for metas in rollouts.values():
        assert sorted(m["step_index"] for m in metas) == list(range(steps))
        last = next(m for m in metas if m["step_index"] == steps - 1)
        assert last["terminated"] or last["truncated"]
    # each task names its groups g<batch>-<i> itself: a group is its id and its env seed
    groups = Counter((m[0]["request_meta"]["group_id"], m[0]["request_meta"]["env_seed"]) for m in rollouts.values())
    assert set(groups.values()) == {group_size}, groups


@pytest.mark.slow  # two servers and an actor run: ~22 s
def test_actor_pushes_whole_batches_that_the_trainers_batch_source_reads(tmp_path, servers, redis) -> None:
    run_id = f"t{uuid.uuid4().hex[:8]}"
    config = _config(tmp_path, servers, redis, run_id, tasks=2)
    proc = _actor(config, "--actor-id", "1", "--batches", "1")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    pushed = [line for line in out.splitlines() if "pushed batch" in line]
    assert sorted(pushed) == ["actor 1 task 0: pushed batch 1 (4 items, 4 in all)",
                              "actor 1 task 1: pushed batch 1 (4 items, 4 in all)"]  # fmt: skip
    assert PASSWORD not in out + err and KEY not in out + err

    async def read() -> list:
        source = PipelineBatchSource(redis_url=redis.url, run_id=run_id, batch_size=4, vocab_size=VOCAB,
                                     queue_wait_s=30)  # fmt: skip
        try:
            return [(await source.next_batch()).items for _ in range(2)]
        finally:
            await source.close()

    batches = asyncio.run(read())
    items = [it for batch in batches for it in batch]
    assert len(items) == 8
    seeds = {it.meta["request_meta"]["env_seed"] for it in items}
    # actor 1 of 2-task actors: task 0 plays stretch 2, task 1 stretch 3 (actor 0 holds stretches 0 and 1)
    assert seeds == {
        2 * ACTOR_SEED_STRIDE,
        2 * ACTOR_SEED_STRIDE + 1,
        3 * ACTOR_SEED_STRIDE,
        3 * ACTOR_SEED_STRIDE + 1,
    }
    _assert_whole(items, group_size=2, steps=1)


@pytest.mark.slow  # an actor process run and stopped: ~8 s
def test_sigterm_mid_run_stops_the_actor_and_leaves_only_whole_batches(tmp_path, servers, redis) -> None:
    run_id = f"t{uuid.uuid4().hex[:8]}"
    config = _config(tmp_path, servers, redis, run_id, tables="max_staleness = 100\n")
    proc = _actor(config, "--grace-s", "20")
    _wait_for_line(proc, "pushed batch 1 ")
    proc.send_signal(signal.SIGTERM)  # the next batch is being generated now
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert time.monotonic() - t0 < 20, "the actor waited for its grace period instead of stopping"
    last = out.splitlines()[-1]
    assert "stopped by SIGTERM" in last
    items = _entries(redis, run_id)
    pushed_lines = out.count("pushed batch")
    assert len(items) == 4 * (pushed_lines + 1)  # + the batch whose line _wait_for_line consumed
    assert f"{len(items)} items pushed" in last
    _assert_whole(items, group_size=2, steps=1)


def test_actor_without_cluster_table_is_refused_naming_it(tmp_path) -> None:
    path = tmp_path / "plain.toml"
    path.write_text(tiny_run_toml(tiny_model_path(), steps=1))
    proc = _actor(path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "ludic actor needs a [cluster] table" in err


@pytest.mark.slow  # waits out the servers' connection bounds: ~8 s
def test_an_actor_whose_servers_are_all_down_exits_naming_them(tmp_path, redis) -> None:
    from ludic.inference.weight_sync.process_group import free_port

    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]  # nothing listens there
    config = _config(tmp_path, dead, redis, f"t{uuid.uuid4().hex[:8]}", tasks=2)
    proc = _actor(config, "--grace-s", "5")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "ludic actor: actor 0 task" in err and "failed: ServerDownError" in err
    assert any(url in err for url in dead)


@pytest.mark.parametrize("protocol", ["openai_program", "verifiers_episode"])
def test_a_protocol_that_calls_its_own_server_is_refused_naming_why(tmp_path, redis, protocol) -> None:
    from ludic.cluster.actor_role import run_actor
    from ludic.config import ConfigError, load_config

    config = _config(tmp_path, ["http://127.0.0.1:9"], redis, "refused",
                     tables=f'[protocol]\nname = "{protocol}"\n')  # fmt: skip
    with pytest.raises(ConfigError, match=f"'{protocol}' sends its model calls to one server itself"):
        run_actor(load_config(str(config)), actor_id=0)


@pytest.mark.slow
def test_a_server_killed_under_the_actor_its_episodes_are_replayed_and_no_half_episode_is_pushed(
    tmp_path, redis
) -> None:
    procs, urls = _servers(2)
    run_id = f"t{uuid.uuid4().hex[:8]}"
    try:
        config = _config(tmp_path, urls, redis, run_id, multi_turn=True, tables="max_staleness = 100\n")
        proc = _actor(config, "--batches", "4")
        _wait_for_line(proc, "pushed batch 1 ")
        procs[0].kill()  # SIGKILL: requests in flight reset, new ones refused
        out, err = proc.communicate(timeout=400)
    finally:
        for p in procs:
            stop_server(p)
    assert proc.returncode == 0, err[-3000:]
    assert "pushed batch 4 " in out
    # the server is named when it goes (a generation or the admission's version query found it gone); an
    # episode it was playing, if any, was replayed ("replaying it from the start") on the other
    assert f"server {urls[0]} failed during" in err and "left out for 30 s" in err
    items = _entries(redis, run_id)
    assert len({it.meta["rollout_id"] for it in items}) == 4 * 4
    _assert_whole(items, group_size=2, steps=3)
