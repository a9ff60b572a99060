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
MIN_TEMPERATURE = 1e-5
"""The smallest temperature above 0 (vLLM's ``_SAMPLING_EPS``): below it ``logits / T`` can overflow
to inf and the softmax to NaN, so such a temperature is refused; send 0 for greedy decoding."""
MAX_STOP_STRINGS = 64
"""The most stop strings one request may carry."""
MAX_STOP_CHARS = 4096
"""The most characters all of one request's stop strings may hold together (each step's stop check
scans a window as long as the longest stop string)."""
SEED_RANGE = (-(2**63), 2**63)
"""Seeds are 64-bit signed ints, as vLLM's API takes them (``-2**63 <= seed < 2**63``)."""


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample one completion.

    temperature: softmax temperature; 0 means greedy decoding, else at least MIN_TEMPERATURE (1e-5).
    top_p: nucleus sampling mass in (0, 1].
    max_tokens: the most completion tokens to generate (>= 1; default DEFAULT_MAX_TOKENS = 256).
    stop: strings that end the completion (the stop string is kept out of the text); at most
        MAX_STOP_STRINGS (64) holding MAX_STOP_CHARS (4096) characters in all.
    seed: per-request sampling seed in [-2**63, 2**63); the same seed and prompt give the same completion.
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
        _check_temperature(self.temperature)
        if not _is_number(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"SamplingConfig.max_tokens must be an int >= 1, got {self.max_tokens!r}")
        _check_stop(self.stop)
        _check_seed(self.seed)

    def with_seed(self, seed: int | None) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p, self.max_tokens, self.stop, seed)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingConfig:
        return cls(**data)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_temperature(value: Any) -> None:
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"SamplingConfig.temperature must be a finite number >= 0, got {value!r:.40}")
    if 0 < value < MIN_TEMPERATURE:
        raise ValueError(
            f"SamplingConfig.temperature {value!r} is below MIN_TEMPERATURE={MIN_TEMPERATURE} (logits / T would "
            "overflow): send 0 for greedy decoding"
        )


def _check_stop(stop: Any) -> None:
    """Bounded before anything looks inside: a request's stop strings cost every decoding step."""
    if not isinstance(stop, tuple):
        raise ValueError(f"SamplingConfig.stop must be a string or a list of strings, got {type(stop).__name__}")
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(f"SamplingConfig.stop has {len(stop)} strings: at most MAX_STOP_STRINGS={MAX_STOP_STRINGS}")
    if not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"SamplingConfig.stop must be non-empty strings, got {stop!r:.200}")
    chars = sum(map(len, stop))
    if chars > MAX_STOP_CHARS:
        raise ValueError(f"SamplingConfig.stop holds {chars} characters: at most MAX_STOP_CHARS={MAX_STOP_CHARS}")


def _check_seed(seed: Any) -> None:
    if seed is None:
        return
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"SamplingConfig.seed must be an int or None, got {seed!r:.40}")
    if not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
        raise ValueError(f"SamplingConfig.seed must be a 64-bit signed int (-2**63 <= seed < 2**63), got {seed}")


@dataclass(frozen=True)
class InferenceSpec:
    """Inference settings carried by a RolloutRequest (pure, JSON-serialisable data)."""

    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def to_dict(self) -> dict[str, Any]:
        return {"sampling": self.sampling.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InferenceSpec:
        return cls(sampling=SamplingConfig.from_dict(data.get("sampling", {})))
