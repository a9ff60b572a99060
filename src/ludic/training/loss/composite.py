"""A weighted sum of losses that shares one token log-prob computation among its terms."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ludic.training.loss import base
from ludic.training.loss.base import Loss, Stats, TokenLogpLoss, require, token_mean_keys


@dataclass
class LossTerm:
    """One named, weighted term of a ``CompositeLoss``."""

    name: str
    loss: Loss
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"LossTerm.name must be non-empty and contain no '/', got {self.name!r}")
        if not hasattr(self.loss, "compute"):
            raise TypeError(f"LossTerm({self.name!r}).loss has no compute(); got {type(self.loss).__name__}")


@dataclass
class CompositeLoss:
    """``L = sum_k weight_k * L_k``; a mean over sequences whenever every term is.

    Stats: ``loss`` (the total), and per term ``<name>/loss``, ``<name>/weight``, ``<name>/<stat>``;
    a term stat named in ``promote`` (``"kl_ref"``) is reported under its bare name too.
    Terms that are ``TokenLogpLoss`` share one ``compute_token_logps`` call; others get the logits.
    """

    terms: list[LossTerm] = field(default_factory=list)
    promote: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError("CompositeLoss.terms is empty; give at least one LossTerm")
        names = [t.name for t in self.terms]
        if len(set(names)) != len(names):
            raise ValueError(f"CompositeLoss term names must be unique, got {names}")

    def compute(self, logits: Tensor, batch: Mapping[str, Tensor]) -> tuple[Tensor, Stats]:
        policy_logps: Tensor | None = None
        if any(isinstance(t.loss, TokenLogpLoss) for t in self.terms):
            policy_logps = base.compute_token_logps(logits, require(batch, "input_ids", "CompositeLoss"))
        return self._combine(logits, policy_logps, batch)

    def compute_from_logps(self, policy_logps: Tensor, batch: Mapping[str, Tensor]) -> tuple[Tensor, Stats]:
        """The total from token log-probs alone; every term must be a ``TokenLogpLoss``."""
        others = [t.name for t in self.terms if not isinstance(t.loss, TokenLogpLoss)]
        if others:
            raise TypeError(f"CompositeLoss.compute_from_logps: terms {others} need the logits; call compute()")
        return self._combine(None, policy_logps, batch)

    def _combine(
        self, logits: Tensor | None, policy_logps: Tensor | None, batch: Mapping[str, Tensor]
    ) -> tuple[Tensor, Stats]:
        ref = logits if logits is not None else policy_logps
        assert ref is not None
        total = torch.zeros((), dtype=ref.dtype, device=ref.device)
        stats = Stats()
        for term in self.terms:
            if isinstance(term.loss, TokenLogpLoss) and policy_logps is not None:
                term_loss, term_stats = term.loss.compute_from_logps(policy_logps, batch)
            else:
                assert logits is not None  # compute_from_logps refused terms that need logits
                term_loss, term_stats = term.loss.compute(logits, batch)
            total = total + term.weight * term_loss
            stats[f"{term.name}/loss"] = term_loss.detach()
            stats[f"{term.name}/weight"] = torch.tensor(float(term.weight), device=ref.device)
            per_token = token_mean_keys(term_stats)
            for key, value in term_stats.items():
                names = ([f"{term.name}/{key}"] if key != "loss" else []) + ([key] if key in self.promote else [])
                for name in names:
                    stats.add(per_token=key in per_token, **{name: value})
        stats["loss"] = total.detach()
        return total, stats
