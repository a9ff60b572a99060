"""``ludic train`` beyond one process: torchrun's world (FSDP2 across hosts) and ``[cluster]``'s servers and Redis.

Under ``torchrun`` (``WORLD_SIZE > 1``) every rank runs ``ludic train CONFIG``: the process group comes up
(gloo on CPU, NCCL with CUDA), the policy is sharded with FSDP2, rank 0 alone reads batches (the Redis stream
in pipeline mode, ``Rank0BatchSource``), publishes (``Rank0OnlyPublisher``), evaluates, logs and writes
metrics; checkpoints are DCP (every rank writes its shards, so ``[checkpoint].output_dir`` must be on a file
system every trainer host sees); the run ends with ``exit_distributed()``. With ``[cluster]`` the trainer is
one role of a multi-host run: pipeline mode on ``[cluster].redis_url`` (password from
``redis_password_env``), no actor tasks of its own (``ludic actor`` runs them elsewhere), every step's
weights sent to each of ``[cluster].servers`` with the bearer token from ``api_key_env``
(``ludic.distributed.fanout``). docs/cluster.md, "The trainer".
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from ludic.config import RunConfig


def world_size() -> int:
    """torchrun's ``WORLD_SIZE`` (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE") or 1)


def rank() -> int:
    """This process's rank: the process group's once it is up, else torchrun's ``RANK`` (0 outside torchrun)."""
    from ludic.distributed import current_rank

    return current_rank()


def cluster_api_key(cluster: Any) -> str | None:
    """The servers' bearer token, from the variable ``[cluster].api_key_env`` names (None: unset or empty)."""
    return os.environ.get(cluster.api_key_env) or None


def cluster_redis_url(cluster: Any) -> str:
    """``[cluster].redis_url`` with the password from ``redis_password_env`` put in (never written anywhere)."""
    password = os.environ.get(cluster.redis_password_env)
    if not password:
        return cluster.redis_url
    parts = urlsplit(cluster.redis_url)
    host = parts.netloc.rpartition("@")[2]
    user = quote(parts.username or "", safe="")
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host}"))


def fanout_publisher(cluster: Any, *, timeout_s: float | None = None, on_failure: str | None = None) -> Any:
    """A ``FanoutPublisher`` with one ``ClientPublisher`` per ``[cluster].servers`` entry (token from the env).

    timeout_s: each server's bound (default ``fanout.DEFAULT_PUBLISH_TIMEOUT_S``); on_failure: default
    ``[cluster].publish_failure``. No retries: a publish that failed is sent again, whole, at the next step.
    """
    from ludic.distributed import ClientPublisher
    from ludic.distributed.fanout import DEFAULT_PUBLISH_TIMEOUT_S, FanoutPublisher
    from ludic.inference import VLLMChatClient

    bound = DEFAULT_PUBLISH_TIMEOUT_S if timeout_s is None else timeout_s
    key = cluster_api_key(cluster)
    targets = {
        url: ClientPublisher(
            VLLMChatClient(base_url=url, api_key=key, enable_weight_updates=True, timeout_s=bound, retries=0),
            timeout_s=bound,
        )
        for url in cluster.servers
    }
    return FanoutPublisher(targets, timeout_s=bound, on_failure=on_failure or cluster.publish_failure)


def cluster_client(cluster: Any) -> Any:
    """The trainer's own client (held-out evaluations, version checks): ``[cluster].servers[0]``."""
    from ludic.inference import VLLMChatClient

    return VLLMChatClient(
        base_url=cluster.servers[0], api_key=cluster_api_key(cluster), enable_weight_updates=True
    )


def pipeline_on(cfg: RunConfig) -> bool:
    """Pipeline mode: ``[pipeline].enabled``, or any ``[cluster]`` run (the trainer reads the cluster's stream)."""
    return cfg.pipeline.enabled or cfg.cluster is not None


def distributed_errors(cfg: RunConfig, world: int | None = None) -> list[str]:
    """What ``ludic train`` cannot do with ``[cluster]`` or under torchrun, each with the reason (for preflight)."""
    if world is None:  # outside torchrun (a --dry-run on any host): the world [cluster] says torchrun will start
        world = world_size() if under_torchrun() or cfg.cluster is None else cfg.cluster.trainer_world_size
    errors: list[str] = []
    if cfg.cluster is not None:
        p, inf = cfg.pipeline, cfg.inference
        if p.redis_url:
            errors.append(
                "[pipeline].redis_url is set with [cluster]: name Redis once, in [cluster].redis_url"
            )
        if "actors" in p.model_fields_set and p.actors:
            errors.append(f"[pipeline].actors = {p.actors} with [cluster]: the trainer runs no actor tasks there; "
                          "start `ludic actor CONFIG` on the actor hosts (set [cluster].actor_tasks)")  # fmt: skip
        if "backend" in inf.model_fields_set or inf.server_url:
            errors.append("[inference] backend/server_url are set with [cluster]: the trainer publishes to every "
                          "[cluster].servers entry and evaluates on the first; leave [inference]'s backend unset")  # fmt: skip
        if cfg.sft is not None:
            errors.append("[sft] with [cluster]: the warm start publishes to one engine, not every server; run the "
                          "SFT as its own one-host `ludic train` and set [model].path to its final_model")  # fmt: skip
    if world > 1 or under_torchrun():  # the model is FSDP-sharded under torchrun, a world of 1 too
        if cfg.cluster is None and cfg.inference.backend != "server":
            errors.append(f"[inference].backend = {cfg.inference.backend!r} under torchrun (WORLD_SIZE={world}): "
                          "only rank 0 generates, and the embedded engine would be a second full copy of the model "
                          "beside its shard (vLLM's backend broadcasts from one unsharded process); run "
                          "`python -m ludic.inference.server` and set backend = \"server\", or use [cluster]")  # fmt: skip
        if cfg.lora is not None:
            errors.append(f"[lora] under torchrun (WORLD_SIZE={world}): ludic train's LoRA run (adapter publishing, "
                          "an engine sharing the frozen base, adapter checkpoints) needs the unsharded peft model; "
                          "train LoRA in one process")  # fmt: skip
        if cfg.sft is not None and cfg.cluster is None:
            errors.append(f"[sft] under torchrun (WORLD_SIZE={world}): the warm start trains the unsharded model; "
                          "run it as a one-process `ludic train` first and set [model].path to its final_model")  # fmt: skip
    return errors


def under_torchrun() -> bool:
    """Started by torchrun (its ``WORLD_SIZE`` is set), whatever the world size (1 included: a resume on fewer hosts)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def train_distributed(cfg: RunConfig, reducers: dict[str, Any] | None = None, *, fresh: bool = False) -> dict:
    """``ludic train`` under torchrun or with ``[cluster]``: returns rank 0's final eval stats ({} elsewhere).

    Under torchrun this ends the process (``exit_distributed``; code 1 after printing the error), so no gloo
    rank aborts at interpreter exit; a run that fails on one rank makes torchrun stop the others.
    """
    import asyncio
    import sys
    import traceback

    from ludic.cli.distributed_train import run_distributed

    if not under_torchrun():
        return asyncio.run(run_distributed(cfg, reducers, fresh=fresh))
    from ludic.training.parallel.fsdp import exit_distributed, init_distributed

    init_distributed(timeout_s=cfg.timeouts.collective_s)
    try:
        asyncio.run(run_distributed(cfg, reducers, fresh=fresh))
    except BaseException:  # the peers are stopped by torchrun; a barrier here could wait for a dead rank
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    exit_distributed(0)
