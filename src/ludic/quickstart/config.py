"""Knobs of ``ludic quickstart``; each field's doc line is also its ``--help`` text."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

# Field name -> help text, read by the CLI so the docs live in one place.
HELP: dict[str, str] = {}


def _doc(default: Any, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


@dataclass
class QuickstartConfig:
    """Everything the quickstart needs; defaults learn visibly in a few minutes on 2 CPU cores."""

    steps: int = _doc(300, "RL training steps")
    group_size: int = _doc(16, "completions per prompt (GRPO group)")
    prompts_per_step: int = _doc(4, "distinct prompts per training step")
    algorithm: str = _doc("grpo", "algorithm preset (grpo, cispo, gspo, reinforce, ...)")
    seed: int = _doc(0, "seed for the tiny model's init and for torch")
    output_dir: str = _doc("runs/quickstart", "where metrics, plot, eval results, checkpoint go")
    model_dir: str | None = _doc(None, "start from this model directory instead of building a tiny one")
    lr: float = _doc(
        5e-4, "RL learning rate (1e-3 sometimes collapses a letter's answer onto another's; 3e-3 always does)"
    )
    warmup_steps: int = _doc(20, "RL learning-rate warm-up steps (then linear decay to 0)")
    sft_steps: int = _doc(30, "SFT warm-start steps on synthetic demonstrations (0 to skip)")
    sft_batch_size: int = _doc(16, "demonstrations per SFT step")
    sft_lr: float = _doc(1e-3, "SFT learning rate")
    max_new_tokens: int = _doc(16, "completion length cap")
    letters: str = _doc("abcdefgh", "letters the task draws from (chance reward is 1/len)")
    count: int = _doc(4, "how many times the letter must be repeated")
    eval_episodes: int = _doc(64, "held-out episodes per evaluation")
    eval_every: int = _doc(50, "evaluate on held-out seeds every N steps (0: only before/after)")
    device: str = _doc("cpu", "torch device for trainer and embedded engine")
    live: bool = _doc(True, "show the live Rich dashboard")
    pipeline: bool = _doc(
        False, "pipeline mode: an actor task pushes to a private Redis stream that the trainer reads"
    )
    max_staleness: int = _doc(1, "pipeline mode: drop items more than this many policy versions old")
    redis_url: str | None = _doc(None, "pipeline mode: use this Redis instead of starting a private one")

    def __post_init__(self) -> None:
        positive = (
            "group_size",
            "prompts_per_step",
            "sft_batch_size",
            "max_new_tokens",
            "count",
            "eval_episodes",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"QuickstartConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("steps", "sft_steps", "eval_every", "warmup_steps", "max_staleness"):
            if getattr(self, name) < 0:
                raise ValueError(f"QuickstartConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "sft_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"QuickstartConfig.{name} must be > 0, got {getattr(self, name)}")
        if len(set(self.letters)) != len(self.letters) or len(self.letters) < 2:
            raise ValueError(
                f"QuickstartConfig.letters must be >= 2 distinct characters, got {self.letters!r}"
            )


HELP.update({f.name: f.metadata["help"] for f in fields(QuickstartConfig)})
