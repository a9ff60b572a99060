"""Data records between rollouts and the trainer, and the seams that produce them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ludic.inference.sampling import InferenceSpec
from ludic.types import Rollout

RolloutStepKey = tuple[str, int]
"""Credit key: ``(rollout.id, step.index)``."""


@dataclass
class ActorTokenLogps:
    """Log-probs the inference engine assigned to each sampled action token."""

    token_logps: list[float]

    def __post_init__(self) -> None:
        if not isinstance(self.token_logps, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in self.token_logps
        ):
            raise TypeError(
                f"ActorTokenLogps.token_logps must be a list of floats, got {self.token_logps!r:.80}"
            )


@dataclass
class SampleAttachments:
    """Optional per-sample tensors-to-be that ride along with a SAWItem.

    ``frozen_logps`` holds, by batch key (``"ref_logps"``, ``"teacher_logps"``), the log-probs a frozen
    model gave each action token (``ludic.training.reference.scoring.FrozenModelScorer``); collation turns
    each key into a ``[B, T]`` tensor aligned like ``actor_logps``.
    """

    actor_logps: ActorTokenLogps | None = None
    frozen_logps: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class SAWItem:
    """State-Action-Weight: one training sample.

    ``input_ids = prompt_token_ids + completion_token_ids``; ``action_mask`` is 0 on the
    state and 1 on the action; ``attachments.actor_logps`` (if any) has one entry per
    action token.

    ``token_weights`` (optional) gives each action token its own credit, one entry per action
    token in order (a multi-turn episode trained as one sequence: each turn's reply carries that
    turn's return). When set, the losses use it in place of ``weight`` (collated as
    ``batch["token_weight"]``), and ``weight`` is only a summary for filters and logs (the
    sequence builders set it to the mean over action tokens).
    """

    input_ids: list[int]
    attention_mask: list[int]
    action_mask: list[int]
    weight: float
    meta: dict[str, Any] = field(default_factory=dict)
    attachments: SampleAttachments = field(default_factory=SampleAttachments)
    token_weights: list[float] | None = None

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        where = (
            f"SAWItem(rollout_id={self.meta.get('rollout_id')!r}, step_index={self.meta.get('step_index')!r})"
        )
        if n == 0:
            raise ValueError(f"{where}: input_ids is empty")
        for name in ("attention_mask", "action_mask"):
            m = len(getattr(self, name))
            if m != n:
                raise ValueError(f"{where}: {name} has {m} entries, input_ids {n}")
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            raise ValueError(f"{where}: weight must be a finite number, got {self.weight!r}")
        actor = self.attachments.actor_logps
        if actor is not None:
            n_action = sum(self.action_mask)
            if len(actor.token_logps) != n_action:
                raise ValueError(
                    f"{where}: actor_logps has {len(actor.token_logps)} entries, "
                    f"action_mask marks {n_action} action tokens"
                )
        if self.token_weights is not None:
            check_token_weights(where, self.token_weights, sum(self.action_mask))
        for key, values in self.attachments.frozen_logps.items():
            if len(values) != sum(self.action_mask):
                raise ValueError(
                    f"{where}: frozen_logps[{key!r}] has {len(values)} entries, "
                    f"action_mask marks {sum(self.action_mask)} action tokens"
                )

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_action_tokens(self) -> int:
        return int(sum(self.action_mask))


def check_token_weights(where: str, values: Any, n_action: int) -> None:
    """ValueError (naming ``where``) unless ``values`` is a list of ``n_action`` finite numbers."""
    if not isinstance(values, list) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in values
    ):
        raise ValueError(f"{where}: token_weights must be a list of finite numbers, got {values!r:.80}")
    if len(values) != n_action:
        raise ValueError(
            f"{where}: token_weights has {len(values)} entries, action_mask marks {n_action} action tokens"
        )


@dataclass
class SAWBatch:
    """A macro-batch of SAW items plus batch-level metadata (``target_rollouts``, ...)."""

    items: list[SAWItem]
    meta: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class BatchSource(Protocol):
    """Where the trainer's macro-batches come from (online rollouts, disk, Redis)."""

    async def next_batch(self) -> SAWBatch: ...


@runtime_checkable
class CreditAssigner(Protocol):
    """Turns rollouts into one scalar weight per step."""

    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]: ...


SampleFilter = Callable[[SAWItem], bool]
"""Returns True to keep a sample."""


@dataclass(frozen=True)
class EnvSpec:
    """Which environment to build: a registry ``kind`` plus factory keyword arguments."""

    kind: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProtocolSpec:
    """Which interaction protocol to build: a registry ``kind`` plus factory keyword arguments."""

    kind: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutRequest:
    """Pure data: what to play, how many times, with which seeds."""

    env: EnvSpec
    protocol: ProtocolSpec
    env_seed: int | None = None
    sampling_seed: int | None = None
    inference: InferenceSpec | None = None
    num_episodes: int = 1
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.num_episodes, int) or self.num_episodes < 1:
            raise ValueError(f"RolloutRequest.num_episodes must be an int >= 1, got {self.num_episodes!r}")


RequestFn = Callable[[], Sequence[RolloutRequest]]
