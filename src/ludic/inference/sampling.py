"""Sampling settings for one chat completion, validated when built.

Which settings a model call uses (the one place this is decided: ``ludic.interaction.steps.step_sampling``):
1. the request's ``RolloutRequest(inference=InferenceSpec(sampling=...))`` when it has one, whole
   (its fields are not merged with the agent's);
2. else the agent's ``Agent(sampling=...)``;
3. else ``SamplingConfig()``: temperature 1.0, top_p 1.0, ``max_tokens=DEFAULT_MAX_TOKENS`` (256).
Whichever wins, a request's ``sampling_seed`` replaces its ``seed`` (one derived seed per model call).
``Evaluator(sampling=...)`` sets every evaluation request's ``inference`` to it; a reply cut at
``max_tokens`` is handled as ``Agent(incomplete_reward=...)`` says.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_MAX_TOKENS = 256
"""``SamplingConfig().max_tokens``: what a model call may generate when nothing else is set."""


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample one completion.

    temperature: softmax temperature; 0 means greedy decoding.
    top_p: nucleus sampling mass in (0, 1].
    max_tokens: the most completion tokens to generate (>= 1; default DEFAULT_MAX_TOKENS = 256).
    stop: strings that end the completion (the stop string is kept out of the text).
    seed: per-request sampling seed; the same seed and prompt give the same completion.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        if (
            not isinstance(self.temperature, (int, float))
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            raise ValueError(
                f"SamplingConfig.temperature must be a finite number >= 0, got {self.temperature!r}"
            )
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"SamplingConfig.max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"SamplingConfig.stop must be non-empty strings, got {self.stop!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"SamplingConfig.seed must be an int or None, got {self.seed!r}")

    def with_seed(self, seed: int | None) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p, self.max_tokens, self.stop, seed)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingConfig:
        return cls(**data)


@dataclass(frozen=True)
class InferenceSpec:
    """Inference settings carried by a RolloutRequest (pure, JSON-serialisable data)."""

    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def to_dict(self) -> dict[str, Any]:
        return {"sampling": self.sampling.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InferenceSpec:
        return cls(sampling=SamplingConfig.from_dict(data.get("sampling", {})))
