"""The two trainers every script builds, wired in one call each: SFT on items, online RL on an engine.

By hand, online RL is ``algo = make_grpo(...)``, ``RolloutBatchSource(engine=, request_fn=,
algorithm=algo, ...)``, ``Trainer(model=, algo=algo, batch_source=...)`` (``examples/minimal_grpo.py``
shows it). ``online_trainer`` is that chain with the one rule it has: the batch source's credit
assigner and the trainer's loss come from the same algorithm object, so the group size is given
once. ``sft_trainer`` is the SFT warm start's ``OfflineBatchSource`` + ``make_sft()`` + ``Trainer``.
``SeededRequests`` is the ``request_fn`` the RL scripts write as ``iter(range(...))`` plus a lambda,
with a data position a Trainer checkpoint saves and restores; ``seeded_episode`` is the
``episode(seed) -> RolloutRequest`` they write for it and for their held-out requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.training.algorithm import RLAlgorithm
from ludic.training.batching import OfflineBatchSource, RolloutBatchSource, RolloutEngine
from ludic.training.presets import make_sft
from ludic.training.trainer import Trainer
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest, SAWItem


def seeded_episode(
    env: str,
    protocol: str,
    *,
    env_kwargs: Mapping[str, Any] | None = None,
    sampling: SamplingConfig | None = None,
    seed_sampling: bool = True,
) -> Callable[[int], RolloutRequest]:
    """``episode(seed)``: the request for one episode of env kind ``env`` played by protocol kind ``protocol``.

    The seed is the env seed and, with ``seed_sampling``, the sampling seed too (the same seed gives
    the same episode: what held-out requests need). ``sampling`` goes into every request's
    ``InferenceSpec``; ``env_kwargs`` to the env factory.
    """
    inference = InferenceSpec(sampling) if sampling is not None else None
    kwargs = dict(env_kwargs or {})

    def episode(seed: int) -> RolloutRequest:
        return RolloutRequest(
            EnvSpec(env, dict(kwargs)), ProtocolSpec(protocol), env_seed=seed,
            sampling_seed=seed if seed_sampling else None, inference=inference,
        )  # fmt: skip

    return episode


@dataclass
class SeededRequests:
    """``request_fn``: each call, ``per_step`` requests ``make_request(seed)`` for the next env seeds.

    ``make_request`` builds one prompt's request (``RolloutBatchSource`` expands it into a GRPO group
    of the algorithm's size). Seeds run from ``next_seed`` up; a call that would reach ``stop`` (the
    first held-out seed, say) raises instead of training on it. ``state_dict`` is the next seed.
    """

    make_request: Callable[[int], RolloutRequest]
    per_step: int
    next_seed: int = 0
    stop: int | None = None

    def __post_init__(self) -> None:
        if self.per_step < 1:
            raise ValueError(
                f"SeededRequests.per_step must be >= 1 (requests per call), got {self.per_step!r}"
            )
        if self.stop is not None and self.stop <= self.next_seed:
            raise ValueError(f"SeededRequests.stop ({self.stop}) must be above next_seed ({self.next_seed})")

    def __call__(self) -> list[RolloutRequest]:
        seeds = range(self.next_seed, self.next_seed + self.per_step)
        if self.stop is not None and seeds.stop > self.stop:
            raise ValueError(
                f"SeededRequests ran out of seeds: the next {self.per_step} from {self.next_seed} reach "
                f"stop={self.stop}; start lower (next_seed) or raise stop"
            )
        self.next_seed = seeds.stop
        return [self.make_request(seed) for seed in seeds]

    def state_dict(self) -> dict[str, int]:
        return {"next_seed": self.next_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_seed = int(state["next_seed"])


def online_trainer(
    model: Any,
    *,
    engine: RolloutEngine,
    algo: RLAlgorithm,
    request_fn: Callable[[], Sequence[RolloutRequest] | Any],
    max_steps: int = 1,
    concurrency: int = 64,
    **trainer_kwargs: Any,
) -> Trainer:
    """A Trainer on a ``RolloutBatchSource`` that plays ``request_fn()`` on ``engine`` every step.

    ``algo`` serves both ends (credit on the batch source's side, loss on the trainer's);
    ``max_steps`` is the episode's turn limit. ``trainer_kwargs`` go to ``Trainer`` (``cfg``,
    ``publisher``, ``train_logger``, ``reducers``, ...).
    """
    source = RolloutBatchSource(
        engine=engine, request_fn=request_fn, algorithm=algo, max_steps=max_steps, concurrency=concurrency
    )
    return Trainer(model=model, algo=algo, batch_source=source, **trainer_kwargs)


def sft_trainer(
    model: Any,
    items: Sequence[SAWItem],
    *,
    batch_size: int = 16,
    shuffle: bool = True,
    seed: int = 0,
    **trainer_kwargs: Any,
) -> Trainer:
    """A ``make_sft()`` Trainer on ``items`` (e.g. ``sft_items(tokenizer, pairs)``), ``batch_size`` a step.

    ``trainer_kwargs`` go to ``Trainer`` (``cfg``, ``publisher``, ...). Items are reshuffled by
    ``seed`` each pass when ``shuffle``.
    """
    source = OfflineBatchSource(list(items), batch_size=batch_size, shuffle=shuffle, seed=seed)
    return Trainer(model=model, algo=make_sft(), batch_source=source, **trainer_kwargs)
