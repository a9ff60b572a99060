"""Evaluate a policy on a fixed set of rollout requests and reduce the results to ``eval/`` stats.

Used by ``ludic eval``, by the Trainer every ``eval_every_n_steps``, and by the quickstart's
before/after figures. The requests are fixed (same env seeds every time) so numbers taken at
different training steps are comparable; only the policy changes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ludic.eval.records import episode_record, step_records
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.training.types import RolloutRequest
from ludic.types import Rollout

GREEDY = SamplingConfig(temperature=0.0)


class Evaluator:
    """Run ``requests`` through a RolloutEngine and summarise them.

    engine: a ``RolloutEngine`` (anything with ``async generate_rollouts(*, requests, max_steps,
        concurrency, include_failed)``); it is called with ``include_failed=True`` and must then return
        each failed episode as one rollout with ``meta["failed"]``, as ``RolloutEngine`` does.
    requests: the fixed evaluation requests (held-out env seeds).
    max_steps: env steps per episode.
    reducers: ``{name: Reducer}`` applied to per-step records (meta paths as in training); outputs
        appear as ``eval/<name>``.
    sampling: decoding for every request (``SamplingConfig(temperature=0.0)`` = greedy); None keeps
        each request's own inference settings. Per-request sampling seeds are kept, so sampled
        evaluation is reproducible.
    concurrency: episodes in flight (overridable per call).
    out_dir: if set, each call writes ``eval_step_<step>.jsonl`` (one line per rollout, then one per
        failed episode with ``"failed": true`` and its ``"error"``) and ``eval_step_<step>_summary.json``
        (``eval_call_<n>...`` when called without a step).

    ``evaluate`` returns:

    - ``eval/num_episodes``: the rollouts that did not fail, one per seat per episode (a two-seat game
      counts 2), empty seats included; the same rollouts as ``last_rollouts``.
    - ``eval/failed_rollouts``: failed *episodes* (an env, protocol or client that raised, a timeout).
      The engine records a failed episode as one rollout with ``meta["failed"]`` (and ``meta["error"]``),
      whatever its number of seats; failed episodes are kept in ``last_failed`` and left out of every
      other stat.
    - ``eval/empty_rollouts``: seats that never moved (``meta["empty"]``: the game ended before their
      turn); counted apart, never averaged in as a reward of 0.
    - ``eval/avg_total_reward``: the mean total reward of the rollouts that played (neither failed nor
      empty); ``eval/parse_error_rate`` and ``eval/avg_completion_length``: over their steps; reducers
      read their steps too. NaN when there is nothing to average.
    - ``eval/seconds``: wall time of the call.

    A NaN or infinite reward raises ValueError naming the rollout, seat, step and env seed, as credit
    assignment does in training (``ludic.training.credit.assigners.check_rollouts``). Neither silent
    choice serves a researcher: a NaN mean hides which episode broke, and a mean that left such episodes
    out would be over whichever episodes the reward function could score, not over the fixed set that
    makes evaluations at different steps comparable. ``last_rollouts`` still holds the episodes, to look
    at.
    """

    def __init__(
        self,
        *,
        engine: Any,
        requests: Sequence[RolloutRequest],
        max_steps: int,
        reducers: Mapping[str, Any] | None = None,
        sampling: SamplingConfig | None = None,
        concurrency: int = 32,
        out_dir: str | Path | None = None,
    ) -> None:
        if not requests:
            raise ValueError("Evaluator.requests is empty; pass at least one RolloutRequest")
        if max_steps < 1:
            raise ValueError(f"Evaluator.max_steps must be >= 1, got {max_steps}")
        if concurrency < 1:
            raise ValueError(f"Evaluator.concurrency must be >= 1, got {concurrency}")
        self.engine = engine
        self.requests = [self._with_sampling(r, sampling) for r in requests]
        self.max_steps = max_steps
        self.reducers = dict(reducers or {})
        self.sampling = sampling
        self.concurrency = concurrency
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.last_rollouts: list[Rollout] = []
        """The latest call's rollouts that did not fail (one per seat per episode)."""
        self.last_failed: list[Rollout] = []
        """The latest call's failed episodes, one rollout each (``meta["error"]`` says why)."""
        self.calls = 0
        self.last_step: int | None = None
        """The step the latest call was made for (None: no call yet, or one without a step)."""
        self.last_stats: dict[str, float] = {}
        """The latest call's stats."""

    @staticmethod
    def _with_sampling(request: RolloutRequest, sampling: SamplingConfig | None) -> RolloutRequest:
        if sampling is None:
            return request
        return dataclasses.replace(request, inference=InferenceSpec(sampling=sampling))

    @property
    def target_episodes(self) -> int:
        """Episodes asked for (each request's ``num_episodes``); a multi-seat episode returns one rollout per seat."""
        return sum(r.num_episodes for r in self.requests)

    async def evaluate(self, *, concurrency: int | None = None, step: int | None = None) -> dict[str, float]:
        """Play every request once; returns ``eval/``-prefixed floats."""
        self.calls += 1
        start = time.perf_counter()
        rollouts = await self.engine.generate_rollouts(
            requests=self.requests,
            max_steps=self.max_steps,
            concurrency=concurrency or self.concurrency,
            include_failed=True,
        )
        self.last_rollouts = [r for r in rollouts if not r.meta.get("failed")]
        self.last_failed = [r for r in rollouts if r.meta.get("failed")]
        stats = self._summarise(self.last_rollouts, failed_episodes=len(self.last_failed))
        stats["eval/seconds"] = time.perf_counter() - start
        if self.out_dir is not None:
            self._write([*self.last_rollouts, *self.last_failed], stats, step)
        self.last_step, self.last_stats = step, dict(stats)
        return stats

    def _summarise(self, rollouts: list[Rollout], *, failed_episodes: int) -> dict[str, float]:
        """``rollouts``: those that did not fail; ``failed_episodes``: how many episodes failed."""
        n = len(rollouts)
        # a seat that never moved (the game ended before its turn: ``meta["empty"]``) played nothing:
        # counted apart, never averaged in as a reward of 0
        played = [r for r in rollouts if not r.meta.get("empty")]
        _check_finite(played)
        rewards = [r.total_reward for r in played]
        steps = [s for r in rollouts for s in r.steps]
        completion_lengths = [len(s.trace.completion_token_ids) for s in steps if s.trace is not None]
        stats = {
            "eval/num_episodes": float(n),
            "eval/failed_rollouts": float(failed_episodes),
            "eval/empty_rollouts": float(n - len(played)),
            "eval/avg_total_reward": _mean(rewards),
            "eval/parse_error_rate": _mean([float(bool(s.info.get("parse_error"))) for s in steps]),
            "eval/avg_completion_length": _mean([float(x) for x in completion_lengths]),
        }
        if self.reducers:
            from ludic.training.stats import apply_reducers_to_records

            reduced = apply_reducers_to_records(step_records(rollouts), self.reducers)
            stats.update({f"eval/{k}": float(v) for k, v in reduced.items()})
        return stats

    def _write(self, rollouts: list[Rollout], stats: dict[str, float], step: int | None) -> None:
        assert self.out_dir is not None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tag = f"call_{self.calls}" if step is None else f"step_{step}"  # no step: ``ludic eval``, a bare call
        with open(self.out_dir / f"eval_{tag}.jsonl", "w") as f:
            for rollout in rollouts:
                f.write(json.dumps(episode_record(rollout), default=str) + "\n")
        summary = {"step": step, **stats}
        (self.out_dir / f"eval_{tag}_summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _check_finite(rollouts: list[Rollout]) -> None:
    """ValueError for the first rollout whose reward is NaN or infinite (a step's, or a total that overflowed)."""
    for r in rollouts:
        if math.isfinite(r.total_reward):
            continue
        bad = next((s for s in r.steps if not math.isfinite(s.reward)), None)
        if bad is not None:
            where = f"step {bad.index} has a non-finite reward ({bad.reward!r})"
        else:
            where = f"total reward is {r.total_reward!r}"
        engine_meta = r.meta.get("engine") if isinstance(r.meta.get("engine"), dict) else {}
        raise ValueError(
            f"evaluation rollout {r.id!r} (agent {r.meta.get('agent_id')!r}, env_seed "
            f"{engine_meta.get('env_seed')!r}, request_meta {r.meta.get('request_meta')!r}): {where}; "
            "fix the env or reward function (Evaluator.last_rollouts holds the episodes)"
        )


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else math.nan
