"""RolloutEngine: plays RolloutRequests concurrently and turns the rollouts into SAW batches.

Each episode builds a fresh env and protocol from the registries (agents are stateful). A failing
episode (an env that raises, a client that gives up, a timeout) never takes the batch down silently:
it is recorded as a failed rollout (``meta["failed"]``, ``meta["error"]``), counted in
``failed_rollouts`` and left out of training; if more than ``max_failure_frac`` of the episodes fail,
the call raises with the first error chained.

A rollout with no steps (a self-play seat the game ended before it moved) is not a failure: it is
labelled ``meta["empty"]``, counted in the batch's ``empty_rollouts`` and never trained; its
(``group_id``, ``agent_id``) group leaves the batch, since its reward would skew the group's baseline.

An episode whose inference server went down (``ServerDownError``, ``ludic.inference.multi_server``) is
played again from its start, up to ``episode_retries`` times, with a fresh env and agent: what the lost
attempt produced is dropped whole. Each attempt runs in its own ``episode_scope`` (a new key), so a
multi-server client keeps the attempt's turns on one server and the retry lands on one that is up.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

from ludic.envs.env import LudicEnv
from ludic.inference.episode_key import episode_scope
from ludic.inference.multi_server import server_went_down
from ludic.interaction.base import InteractionProtocol
from ludic.training.algorithm import RLAlgorithm
from ludic.training.batching.busy_clock import BusyClock
from ludic.training.batching.requests import derive_seed
from ludic.training.batching.rollout_checks import check_episode_rollouts, rollout_jsonl_line
from ludic.training.batching.saw_builder import batch_meta, rollouts_to_saw_items
from ludic.training.batching.sequence_items import rollouts_to_sequence_items
from ludic.training.types import RolloutRequest, SampleFilter, SAWBatch
from ludic.types import Rollout

EnvFactory = Callable[..., LudicEnv]
ProtocolFactory = Callable[..., InteractionProtocol]
log = logging.getLogger(__name__)


class EpisodeFailuresError(RuntimeError):
    """Too many episodes of one call failed."""


class RolloutEngine:
    """Generates rollouts from requests; see the module docstring for failure handling."""

    def __init__(
        self,
        *,
        env_registry: Mapping[str, EnvFactory],
        protocol_registry: Mapping[str, ProtocolFactory],
        jsonl_path: str | Path | None = None,
        max_failure_frac: float = 0.5,
        default_max_steps: int = 16,
        one_sequence: bool = False,
        episode_retries: int = 0,
    ) -> None:
        if not 0.0 <= max_failure_frac <= 1.0:
            raise ValueError(f"max_failure_frac must be in [0, 1], got {max_failure_frac!r}")
        if episode_retries < 0:
            raise ValueError(f"episode_retries must be >= 0, got {episode_retries!r}")
        self.episode_retries = episode_retries
        """Replays of an episode from its start after its server went down (``ServerDownError``)."""
        self.env_registry = dict(env_registry)
        self.protocol_registry = dict(protocol_registry)
        self.jsonl_path = Path(jsonl_path) if jsonl_path is not None else None
        self.max_failure_frac = max_failure_frac
        self.default_max_steps = default_max_steps
        self.one_sequence = one_sequence
        """Train each rollout as one sequence where its ids allow (``batching.sequence_items``)."""

    # ---- rollouts ---------------------------------------------------------------------------
    async def generate_rollouts(
        self,
        *,
        requests: Sequence[RolloutRequest],
        max_steps: int,
        timeout_s: float | None = None,
        concurrency: int = 8,
        include_failed: bool = False,
        env_clock: BusyClock | None = None,
        for_training: bool = False,
    ) -> list[Rollout]:
        """Play every request's ``num_episodes`` episodes, at most ``concurrency`` at a time; ``env_clock``
        times the envs' steps (``astep``: rewards, verifiers). ``for_training`` (set by ``generate_batch``)
        fails, alone, an episode training cannot use: a non-finite reward, a step without its token traces."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
        for request in requests:  # unknown kinds are configuration errors, not episode failures
            self._lookup(self.env_registry, request.env.kind, "env")
            self._lookup(self.protocol_registry, request.protocol.kind, "protocol")
        semaphore = asyncio.Semaphore(concurrency)

        async def bounded(
            request: RolloutRequest, episode_idx: int
        ) -> tuple[list[Rollout], Exception | None]:
            async with semaphore:
                return await self._run_episode(
                    request, episode_idx, max_steps, timeout_s, env_clock, for_training=for_training
                )

        jobs = [bounded(r, k) for r in requests for k in range(r.num_episodes)]
        episodes = await asyncio.gather(*jobs)
        rollouts = [ro for episode_rollouts, _ in episodes for ro in episode_rollouts]
        self._write_jsonl(rollouts)
        errors = [exc for _, exc in episodes if exc is not None]
        self._check_failures(errors, total=len(jobs))
        return rollouts if include_failed else [r for r in rollouts if not r.meta.get("failed")]

    async def _run_episode(
        self, request: RolloutRequest, episode_idx: int, max_steps: int, timeout_s: float | None,
        env_clock: BusyClock | None = None, *, for_training: bool = False,
    ) -> tuple[list[Rollout], Exception | None]:
        sampling_seed = request.sampling_seed
        if sampling_seed is not None and episode_idx > 0:
            sampling_seed = derive_seed("episode", sampling_seed, episode_idx)
        base_meta = {
            "request_meta": request.meta,
            "episode_idx": episode_idx,
            "engine": {
                "max_steps": max_steps,
                "env_kind": request.env.kind,
                "protocol_kind": request.protocol.kind,
                "env_seed": request.env_seed,
                "sampling_seed": sampling_seed,
            },
        }
        for attempt in range(self.episode_retries + 1):
            with episode_scope(uuid.uuid4().hex):
                rollouts, exc = await self._attempt(
                    request, max_steps, timeout_s, env_clock, sampling_seed, base_meta, for_training
                )
            if exc is None or attempt == self.episode_retries or not server_went_down(exc):
                break
            log.warning("episode %d of request %s lost its server (%s); replaying it from the start (retry %d/%d)",
                        episode_idx, request.meta, exc, attempt + 1, self.episode_retries)  # fmt: skip
        for rollout in rollouts:
            rollout.meta["episode_attempts"] = attempt + 1
        return rollouts, exc

    async def _attempt(
        self, request: RolloutRequest, max_steps: int, timeout_s: float | None, env_clock: BusyClock | None,
        sampling_seed: int | None, base_meta: dict[str, Any], for_training: bool = False,
    ) -> tuple[list[Rollout], Exception | None]:
        """One try at the episode: a fresh env and protocol; a failure is one failed rollout and its error."""
        try:
            env = self.env_registry[request.env.kind](**request.env.kwargs)
            if env_clock is not None:
                env.astep = env_clock.wrap(env.astep)  # type: ignore[method-assign]
            protocol = self.protocol_registry[request.protocol.kind](**request.protocol.kwargs)
            async with asyncio.timeout(timeout_s):  # also bounds a protocol that ignores timeout_s
                rollouts = await protocol.run(
                    env=env,
                    max_steps=max_steps,
                    env_seed=request.env_seed,
                    sampling_seed=sampling_seed,
                    inference=request.inference,
                    timeout_s=timeout_s,
                )
            check_episode_rollouts(rollouts, max_steps, request.protocol.kind, for_training=for_training)
        except Exception as exc:  # recorded, counted and excluded; see _check_failures
            return [Rollout(meta={**base_meta, "failed": True, "error": _describe(exc)})], exc
        for rollout in rollouts:
            rollout.meta.update(base_meta)
            if not rollout.steps:
                rollout.meta["empty"] = True
        return list(rollouts), None

    def _check_failures(self, errors: Sequence[Exception], *, total: int) -> None:
        if errors and len(errors) > self.max_failure_frac * total:
            first = errors[0]
            raise EpisodeFailuresError(
                f"{len(errors)} of {total} episodes failed (max_failure_frac={self.max_failure_frac}); "
                f"first: {type(first).__name__}: {first}"
            ) from first

    # ---- batches ----------------------------------------------------------------------------
    async def generate_batch(
        self,
        requests: Sequence[RolloutRequest],
        algorithm: RLAlgorithm,
        sample_filter: SampleFilter | None = None,
        *,
        max_steps: int | None = None,
        timeout_s: float | None = None,
        concurrency: int = 8,
    ) -> SAWBatch:
        """Rollouts -> credit (``algorithm.credit_assigner``) -> SAW items -> filter.

        Batch meta counts what the filter removed: ``num_samples_before_filter``, ``num_samples_filtered``,
        and says where the call's time went (``time/score_seconds``: wall time while some env step ran;
        ``time/generate_seconds``: the rest of the episodes; ``time/credit_seconds``: the Trainer reports
        them in the step's ``time/`` split).

        ``algorithm.preprocess`` is NOT applied here: the Trainer applies it to every batch.
        A failed episode takes its whole GRPO group (same ``group_id``) out of the batch, since
        group normalisation needs complete groups; an empty rollout (counted in ``empty_rollouts``) takes its
        seat's group (same ``group_id`` and ``agent_id``) out.
        """
        t0, env_clock = perf_counter(), BusyClock()
        rollouts = await self.generate_rollouts(
            requests=requests,
            max_steps=max_steps if max_steps is not None else self.default_max_steps,
            timeout_s=timeout_s,
            concurrency=concurrency,
            include_failed=True,
            env_clock=env_clock,
            for_training=True,
        )
        t_credit = perf_counter()
        failed = [r for r in rollouts if r.meta.get("failed")]
        empty = [r for r in rollouts if r.meta.get("empty")]
        broken_groups = {_group_id(r) for r in failed} - {None}
        broken_seats = {_seat_group(r) for r in empty if _group_id(r) is not None}
        usable = [
            r for r in rollouts
            if not (r.meta.get("failed") or r.meta.get("empty"))
            and _group_id(r) not in broken_groups and _seat_group(r) not in broken_seats
        ]  # fmt: skip
        weights = algorithm.credit_assigner.compute(usable)
        build = rollouts_to_sequence_items if self.one_sequence else rollouts_to_saw_items
        items = build(usable, weights)
        num_before_filter = len(items)
        if sample_filter is not None:
            items = [item for item in items if sample_filter(item)]
        meta: dict[str, Any] = batch_meta(
            target_rollouts=sum(r.num_episodes for r in requests),
            rollouts=usable,
            items=items,
            failed=len(failed),
        )
        meta["empty_rollouts"] = float(len(empty))
        meta["episode_retries"] = float(sum(r.meta.get("episode_attempts", 1) - 1 for r in rollouts))
        meta["dropped_group_rollouts"] = float(len(rollouts) - len(failed) - len(empty) - len(usable))
        meta["num_samples_before_filter"] = float(num_before_filter)
        meta["num_samples_filtered"] = float(num_before_filter - len(items))
        meta["time/score_seconds"] = env_clock.seconds  # while some env step ran (rewards, verifiers)
        meta["time/generate_seconds"] = t_credit - t0 - env_clock.seconds  # the rest of the episodes: sampling
        meta["time/credit_seconds"] = perf_counter() - t_credit  # credit, items and the sample filter
        return SAWBatch(items=items, meta=meta)

    # ---- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _lookup(registry: Mapping[str, Any], kind: str, what: str) -> Any:
        if kind not in registry:
            raise KeyError(f"unknown {what} kind {kind!r}; registered: {sorted(registry)}")
        return registry[kind]

    def _write_jsonl(self, rollouts: Sequence[Rollout]) -> None:
        if self.jsonl_path is None:
            return
        self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        with self.jsonl_path.open("a", encoding="utf-8") as f:
            for rollout in rollouts:
                f.write(rollout_jsonl_line(rollout) + "\n")


def _group_id(rollout: Rollout) -> Any:
    return (rollout.meta.get("request_meta") or {}).get("group_id")


def _seat_group(rollout: Rollout) -> tuple[Any, Any]:
    """The group credit is normalised over: (group_id, agent_id), one per seat in multi-agent games."""
    return _group_id(rollout), rollout.meta.get("agent_id")


def _describe(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc) or repr(exc)}
