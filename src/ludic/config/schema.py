"""The run-config schema read by ``ludic train`` / ``ludic eval``: one dataclass per table.

Each field's docstring line is its documentation. ``[trainer]`` and ``[checkpoint]`` tables
are checked against ``TrainerConfig`` / ``CheckpointConfig`` themselves (see ``load.py``), so
every trainer knob is configurable without being repeated here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ludic.inference.sampling import SamplingConfig


@dataclass
class ModelSection:
    """path: local model directory (or hub name) loaded with ``from_pretrained``.
    tokenizer: tokenizer directory if different from ``path``.
    device: torch device for the trainer and the embedded engine.
    dtype: parameter dtype.
    """

    path: str
    tokenizer: str | None = None
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


@dataclass
class ComponentSection:
    """name: registry name (``ludic list`` shows them). kwargs: passed to the registered factory."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class HarnessSection(ComponentSection):
    name: str = "plain"


@dataclass
class ProtocolSection(ComponentSection):
    name: str = "single_agent"


@dataclass
class AlgorithmSection(ComponentSection):
    name: str = "grpo"


@dataclass
class SamplingSection:
    """temperature: 0 means greedy. top_p: nucleus mass. max_tokens: completion cap. stop: stop strings."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.to_sampling()  # SamplingConfig's own checks, with its messages

    def to_sampling(self, seed: int | None = None) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p, self.max_tokens, tuple(self.stop), seed)


@dataclass
class InferenceSection:
    """backend: "embedded" (in-process TransformersChatClient) or "server" (a vLLM OpenAI server).
    server_url: the server's base URL (backend "server" only).
    max_batch_size: the embedded engine's largest generation batch.
    """

    backend: Literal["embedded", "server"] = "embedded"
    server_url: str | None = None
    max_batch_size: int = 64

    def __post_init__(self) -> None:
        if self.backend == "server" and not self.server_url:
            raise ValueError("backend 'server' needs server_url (e.g. 'http://127.0.0.1:8000')")
        if self.backend == "embedded" and self.server_url:
            raise ValueError(f"server_url={self.server_url!r} is set but backend is 'embedded'")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")


@dataclass
class RolloutSection:
    """prompts_per_step: distinct env seeds per training step.
    group_size: completions per prompt (GRPO group).
    max_steps: env steps per episode.
    concurrency: episodes run at once.
    seed: first training env seed (seeds count up from here).
    sampling: decoding for training rollouts.
    """

    prompts_per_step: int = 4
    group_size: int = 8
    max_steps: int = 1
    concurrency: int = 64
    seed: int = 0
    sampling: SamplingSection = field(default_factory=SamplingSection)

    def __post_init__(self) -> None:
        for name in ("prompts_per_step", "group_size", "max_steps", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class EvalSection:
    """num_episodes: held-out episodes per evaluation.
    seed_offset: held-out env seeds are seed_offset, seed_offset + 1, ...
    concurrency: episodes run at once.
    every_n_steps: evaluate during training every N steps (0: only before and after).
    sampling: decoding for evaluation (temperature 0 = greedy).
    env_kwargs: overrides of ``[env].kwargs`` for evaluation (e.g. a held-out test file).
    """

    num_episodes: int = 32
    seed_offset: int = 1_000_000
    concurrency: int = 32
    every_n_steps: int = 0
    sampling: SamplingSection = field(default_factory=lambda: SamplingSection(temperature=0.0))
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_episodes < 1:
            raise ValueError(f"num_episodes must be >= 1, got {self.num_episodes}")
        if self.every_n_steps < 0:
            raise ValueError(f"every_n_steps must be >= 0, got {self.every_n_steps}")


@dataclass
class LoggingSection:
    """output_dir: where metrics.jsonl, the plot, eval results and checkpoints go.
    rich: live terminal dashboard. plot: write reward/loss PNG at the end.
    """

    output_dir: str = "runs/ludic"
    rich: bool = True
    plot: bool = True


@dataclass
class RunConfig:
    """A whole run, described by names and keyword arguments."""

    model: ModelSection
    env: ComponentSection
    harness: HarnessSection = field(default_factory=HarnessSection)
    protocol: ProtocolSection = field(default_factory=ProtocolSection)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    inference: InferenceSection = field(default_factory=InferenceSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    eval: EvalSection = field(default_factory=EvalSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    trainer: Any = field(default_factory=dict)
    """Keyword arguments of ``TrainerConfig`` (checked against it); a ``TrainerConfig`` once loaded."""
    checkpoint: Any = None
    """Keyword arguments of ``CheckpointConfig``; ``output_dir`` defaults to ``<logging.output_dir>/checkpoints``."""
    steps: int = 100
    """Training steps for ``ludic train``."""
    seed: int = 0
    """torch seed."""
    source: str = field(default="<config>", init=False)
    """The file this config came from (set by the loader; not a config key)."""

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
