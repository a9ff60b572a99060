"""``ludic actor CONFIG --actor-id N``: one actor host of a multi-host run (docs/cluster.md, "Actors and servers").

The host plays ``[rollout]`` GRPO groups exactly as ``ludic train``'s own pipeline actors do (the same
engine, harness, protocol, algorithm and request stream, ``ludic.cli.runtime``), but on a
``MultiServerClient`` over ``[cluster].servers`` (bearer token from ``api_key_env``), and pushes the SAW
items to ``[cluster].redis_url``'s stream (password from ``redis_password_env``) for the trainer, wherever
it runs. ``[cluster].actor_tasks`` tasks run side by side, task ``i`` of actor ``N`` on env seeds from
``[rollout].seed + (N * actor_tasks + i) * ACTOR_SEED_STRIDE``: distinct actor ids never play the same
episode.

An episode whose server dies is replayed from its start on another (up to one replay per server) or
counted failed; a batch is pushed whole in one MULTI/EXEC or not at all. SIGTERM (or Ctrl-C) stops the
tasks: a batch still being generated is dropped, never half-pushed; after ``grace_s`` the tasks are
cancelled. One line is printed per pushed batch.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from typing import Any

from ludic.config import ConfigError, RunConfig


def task_first_seed(cfg: RunConfig, actor_id: int, task: int) -> int:
    """The first env seed of ``task`` on actor ``actor_id`` (stretches never overlap across ids)."""
    from ludic.cli.pipeline_mode import ACTOR_SEED_STRIDE

    assert cfg.cluster is not None
    return cfg.rollout.seed + (actor_id * cfg.cluster.actor_tasks + task) * ACTOR_SEED_STRIDE


def run_actor(
    cfg: RunConfig, *, actor_id: int, batches: int | None = None, grace_s: float = 30.0,
    out: Callable[[str], None] | None = None,
) -> int:  # fmt: skip
    """Run the actor host until SIGTERM / Ctrl-C, or ``batches`` batches per task; the exit code."""
    if cfg.cluster is None:
        raise ConfigError([f"{cfg.source}: ludic actor needs a [cluster] table (servers, redis_url)"])
    if actor_id < 0:
        raise ConfigError([f"--actor-id must be >= 0, got {actor_id}"])
    if batches is not None and batches < 1:
        raise ConfigError([f"--batches must be >= 1, got {batches}"])
    if grace_s < 0:
        raise ConfigError([f"--grace-s must be >= 0, got {grace_s}"])
    _check_protocol(cfg)
    if out is None:  # each line at once, also into a pipe (a launcher's log)

        def out(line: str) -> None:
            print(line, flush=True)

    return asyncio.run(_run(cfg, actor_id, batches, grace_s, out))


def _check_protocol(cfg: RunConfig) -> None:
    """A protocol with its own ``base_url`` (``openai_program``, ``verifiers_episode``) sends its model calls to
    one server itself, past the actor's client: its episodes could not be spread over ``[cluster].servers``."""
    import inspect

    from ludic.registry import get_protocol

    if "base_url" in inspect.signature(get_protocol(cfg.protocol.name)).parameters:
        raise ConfigError([
            f"{cfg.source}: [protocol] {cfg.protocol.name!r} sends its model calls to one server itself "
            "(base_url), not through the actor's client, so ludic actor cannot spread its episodes over "
            "[cluster].servers or replay them when a server dies; use a protocol that plays an agent "
            "(single_agent, multi_agent)"
        ])  # fmt: skip


async def _run(cfg: RunConfig, actor_id: int, batches: int | None, grace_s: float, out: Callable[[str], None]) -> int:
    from ludic.cli.distributed_run import cluster_api_key, cluster_redis_url
    from ludic.cli.runtime import make_algorithm, make_engine, make_rollout_source
    from ludic.inference.multi_server import MultiServerClient
    from ludic.training.pipeline import run_pipeline_actor

    cluster, timeouts = cfg.cluster, cfg.timeouts
    assert cluster is not None
    client = MultiServerClient(cluster.servers, api_key=cluster_api_key(cluster), timeout_s=timeouts.http_s)
    engine = make_engine(cfg, client, cfg.rollout.sampling.to_sampling())
    engine.episode_retries = len(cluster.servers)  # one replay per server: a lost episode moves on
    algo = make_algorithm(cfg)
    stop = asyncio.Event()
    stopped_by: list[str] = []
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda s=sig: (stopped_by.append(signal.Signals(s).name), stop.set()))

    pushed = [0]  # items in the stream from this host

    def printer(task: int) -> Callable[[Any, int], None]:
        def on_push(stats: Any, n: int) -> None:
            pushed[0] += n
            out(f"actor {actor_id} task {task}: pushed batch {stats.batches} ({n} items, {stats.items} in all)")

        return on_push

    tasks = [
        asyncio.create_task(run_pipeline_actor(
            source=make_rollout_source(cfg, engine, algo, task_first_seed(cfg, actor_id, i)),
            redis_url=cluster_redis_url(cluster), run_id=cfg.pipeline.run_id,
            trainer_batch_size=cfg.rollout.prompts_per_step * cfg.rollout.group_size,
            max_staleness=cfg.pipeline.max_staleness, num_batches=batches, stop=stop,
            policy_version_fn=client.get_policy_version, wait_s=timeouts.queue_wait_s,
            call_timeout_s=timeouts.redis_s, reconnect_timeout_s=timeouts.redis_reconnect_s, on_push=printer(i),
        ), name=f"actor {actor_id} task {i}")
        for i in range(cluster.actor_tasks)
    ]  # fmt: skip
    out(f"actor {actor_id}: {len(tasks)} task(s) on {len(cluster.servers)} server(s), stream "
        f"{cfg.pipeline.run_id!r}, env seeds from {task_first_seed(cfg, actor_id, 0)}")  # fmt: skip
    try:
        code = await _supervise(tasks, stop, grace_s)
        if code == 0:
            why = f"stopped by {stopped_by[0]}" if stopped_by else "done"
            out(f"actor {actor_id}: {why}; {pushed[0]} items pushed (a batch still in generation is dropped whole)")
        return code
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await client.aclose()


async def _supervise(tasks: list[asyncio.Task], stop: asyncio.Event, grace_s: float) -> int:
    """Wait for the tasks; the first failure or a signal stops them all (cancelled after ``grace_s``)."""
    stop_wait = asyncio.create_task(stop.wait())
    pending: set[asyncio.Task] = set(tasks)
    while pending and not stop.is_set():
        done, pending = await asyncio.wait(pending | {stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        pending.discard(stop_wait)
        if any(t.exception() is not None for t in done if t is not stop_wait):
            break
    stop.set()
    if pending:
        _, late = await asyncio.wait(pending, timeout=grace_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    stop_wait.cancel()
    failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
    for task in failed:
        exc = task.exception()
        print(f"ludic actor: {task.get_name()} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1 if failed else 0
