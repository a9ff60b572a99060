"""``[lora]``: LoRA adapters around ``[model]`` (a table of the run config, ``ludic.config.schema``)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from ludic.config.section_base import Section, _at_least


class LoraSection(Section):
    """``[lora]``: train LoRA adapters on a frozen base instead of every weight (docs/lora.md; needs the
    ``peft`` extra)."""

    rank: int = 8
    """Rank ``r`` of each adapter (A is ``[r, in]``, B ``[out, r]``)."""
    alpha: float | None = None
    """``lora_alpha``: the update is scaled by ``alpha / rank`` (``alpha / sqrt(rank)`` with ``rslora``);
    default ``2 * rank``."""
    targets: list[str] | Literal["all-linear"] = "all-linear"
    """Module names to adapt (``["q_proj", "v_proj"]``: every module whose name ends with one of them), or
    ``"all-linear"``: every linear layer but the output head. Checked against the model by ``--dry-run``."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training (0 keeps the trainer's log-probs equal to the engine's)."""
    rslora: bool = False
    """Rank-stabilised scaling ``alpha / sqrt(rank)`` (peft's ``use_rslora``)."""
    publish: Literal["adapter", "merged"] = "adapter"
    """What each step sends to inference: the adapter alone ("adapter": ~1% of the bytes; the embedded engine
    and Ludic's server serve it on the base they hold) or merged weights ("merged": any server, vLLM's
    weight routes included)."""
    serving: Literal["unmerged", "fold"] = "unmerged"
    """How the embedded engine serves a published adapter: "unmerged" (beside the base, which it then shares
    with the trainer: one frozen base in the process) or "fold" (into its weights: a base-speed forward, a copy
    of the adapted layers). A server takes ``--adapter-serving`` when started."""

    @model_validator(mode="after")
    def _check(self) -> LoraSection:
        _at_least(self, 1, "rank")
        if self.alpha is not None and not self.alpha > 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if isinstance(self.targets, list):
            if not self.targets:
                raise ValueError('targets is empty: name modules (["q_proj", "v_proj"]) or give "all-linear"')
            blank = [i for i, name in enumerate(self.targets) if not name.strip() or name == "all-linear"]
            if blank:
                raise ValueError(f'targets[{blank[0]}] is {self.targets[blank[0]]!r}: give module names, '
                                 'or targets = "all-linear" alone')  # fmt: skip
        return self

    @property
    def lora_alpha(self) -> float:
        """``alpha``, defaulting to ``2 * rank``."""
        return float(2 * self.rank if self.alpha is None else self.alpha)
