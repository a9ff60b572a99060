"""Synchronous online RL: every ``next_batch`` plays fresh requests with the current policy."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from ludic.training.algorithm import RLAlgorithm
from ludic.training.batching.requests import GRPORequestStrategy, RequestStrategy
from ludic.training.batching.rollout_engine import RolloutEngine
from ludic.training.types import RolloutRequest, SampleFilter, SAWBatch


class RolloutBatchSource:
    """``request_fn()`` -> (``request_strategy.expand``) -> ``engine.generate_batch`` -> SAWBatch.

    ``request_fn`` may be sync or async and returns the requests for one macro-batch. Where it
    (or ``request_strategy``) has ``state_dict``/``load_state_dict`` (a data position, a seed
    counter), :meth:`state_dict` gathers them so a Trainer checkpoint resumes the data exactly.

    GRPO groups are formed here, in one way, with one number: when the algorithm's credit
    assigner groups rollouts (``make_grpo(group_size=G)`` and the other group presets) and no
    ``request_strategy`` is given, each request becomes a group of G episodes
    (``GRPORequestStrategy(G)``), so ``request_fn`` returns one request per prompt. A
    ``GRPORequestStrategy`` whose group size differs from the algorithm's is a ValueError. Requests
    that already carry ``meta["group_id"]`` (grouped by hand) need
    ``request_strategy=IdentityRequestStrategy()``, else they are refused rather than grouped twice.
    """

    def __init__(
        self,
        *,
        engine: RolloutEngine,
        request_fn: Callable[[], Sequence[RolloutRequest] | Any],
        algorithm: RLAlgorithm,
        max_steps: int,
        sample_filter: SampleFilter | None = None,
        concurrency: int = 8,
        timeout_s: float | None = None,
        request_strategy: RequestStrategy | None = None,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps!r}")
        self.engine = engine
        self.request_fn = request_fn
        self.algorithm = algorithm
        self.max_steps = max_steps
        self.sample_filter = sample_filter
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.request_strategy, self._auto_groups = _group_strategy(algorithm, request_strategy)

    async def next_batch(self) -> SAWBatch:
        requests = self.request_fn()
        if inspect.isawaitable(requests):
            requests = await requests
        requests = list(requests)
        if not requests:
            raise ValueError("RolloutBatchSource.request_fn returned no requests")
        if self._auto_groups and any("group_id" in r.meta for r in requests):
            raise ValueError(
                "request_fn returned requests that already carry meta['group_id'], and RolloutBatchSource "
                f"forms groups of {self._auto_groups} itself (the algorithm's group_size); return one request "
                "per prompt, or pass request_strategy=IdentityRequestStrategy() if you group them yourself"
            )
        if self.request_strategy is not None:
            requests = self.request_strategy.expand(requests)
        return await self.engine.generate_batch(
            requests,
            self.algorithm,
            self.sample_filter,
            max_steps=self.max_steps,
            timeout_s=self.timeout_s,
            concurrency=self.concurrency,
        )

    def _stateful(self) -> dict[str, Any]:
        parts = {"request_fn": self.request_fn, "request_strategy": self.request_strategy}
        return {k: v for k, v in parts.items() if callable(getattr(v, "state_dict", None))}

    def state_dict(self) -> dict[str, Any]:
        """Plain data (JSON) for the Trainer's checkpoint; ``{}`` when nothing here keeps state."""
        return {name: part.state_dict() for name, part in self._stateful().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        parts = self._stateful()
        unknown = sorted(set(state) - set(parts))
        if unknown:
            raise ValueError(f"RolloutBatchSource state has {unknown} but this source has no such state")
        for name, part_state in state.items():
            parts[name].load_state_dict(part_state)


def algorithm_group_size(algorithm: RLAlgorithm) -> int | None:
    """The group size the algorithm's credit assigner normalises over (None if it does not group)."""
    size = getattr(algorithm.credit_assigner, "group_size", None)
    return size if isinstance(size, int) and size > 0 else None


def _group_strategy(
    algorithm: RLAlgorithm, strategy: RequestStrategy | None
) -> tuple[RequestStrategy | None, int]:
    """(the strategy to use, the group size when it was chosen here from the algorithm, else 0)."""
    size = algorithm_group_size(algorithm)
    if strategy is None:
        return (GRPORequestStrategy(group_size=size), size) if size else (None, 0)
    if size and isinstance(strategy, GRPORequestStrategy) and strategy.group_size != size:
        raise ValueError(
            f"GRPORequestStrategy(group_size={strategy.group_size}) but the algorithm "
            f"{algorithm.name!r} normalises groups of {size}; set the group size once, in the preset "
            f"(make_grpo(group_size=...)), and drop request_strategy: RolloutBatchSource then forms the groups"
        )
    return strategy, 0
