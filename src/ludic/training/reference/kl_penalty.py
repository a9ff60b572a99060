"""KL to a reference model for any preset: a scorer in preprocessing plus a KL term in the loss.

``add_kl_penalty(algo, kl_coeff=0.1, ref_model=...)`` turns ``algo`` into
``L = L_algo + kl_coeff * L_kl`` (``L_kl``: ``TokenKLLoss`` against ``batch["ref_logps"]``, k2 gradient,
see ``training/loss/kl.py``) and appends a ``FrozenModelScorer`` that fills ``ref_logps`` to its preprocess
chain, after the filters, so only the items that are trained on get scored. The Trainer stays blind
to both. Reported stat: ``kl_ref``, the mean per-token k3 estimate of KL(policy || reference).
"""

from __future__ import annotations

from typing import Any

from ludic.training.algorithm import RLAlgorithm, chain_preprocess
from ludic.training.loss import CompositeLoss, LossTerm, TokenKLLoss
from ludic.training.reference.scoring import FrozenModelScorer, ModelLike

RefModel = ModelLike | FrozenModelScorer


def as_scorer(model: RefModel, *, key: str, **scorer_kwargs: Any) -> FrozenModelScorer:
    """``model`` itself when it is a scorer (its key must be ``key``), else a scorer for it."""
    if isinstance(model, FrozenModelScorer):
        if model.key != key:
            raise ValueError(f"the scorer writes batch[{model.key!r}] but this loss reads batch[{key!r}]")
        return model
    return FrozenModelScorer(model, key=key, **scorer_kwargs)


def frozen_kl(
    model: RefModel, *, key: str, stat_key: str, length_normalize: bool, **scorer_kwargs: Any
) -> tuple[FrozenModelScorer, TokenKLLoss]:
    """The scorer that writes ``batch[key]`` and the k2 KL term that reads it, built as one pair so
    the key cannot drift between them (the reference's ``ref_logps``, distillation's ``teacher_logps``)."""
    scorer = as_scorer(model, key=key, **scorer_kwargs)
    return scorer, TokenKLLoss(ref_logps_key=key, length_normalize=length_normalize, stat_key=stat_key)


def add_kl_penalty(
    algo: RLAlgorithm,
    *,
    kl_coeff: float,
    ref_model: RefModel | None,
    length_normalize: bool,
    preset: str,
) -> RLAlgorithm:
    """``algo`` with a ``kl_coeff``-weighted KL term to ``ref_model`` (unchanged when both are unset)."""
    if not isinstance(kl_coeff, (int, float)) or isinstance(kl_coeff, bool) or not kl_coeff >= 0:
        raise ValueError(f"{preset}: kl_coeff must be a number >= 0, got {kl_coeff!r}")
    if kl_coeff == 0 and ref_model is None:
        return algo
    if ref_model is None:
        raise ValueError(
            f"{preset}(kl_coeff={kl_coeff}) needs ref_model=...: the KL is measured against a frozen "
            "reference model (a save_pretrained directory, a loaded nn.Module, e.g. the initial policy, or "
            "a FrozenModelScorer); without one there is nothing to be close to"
        )
    if kl_coeff == 0:
        raise ValueError(
            f"{preset}: ref_model was given but kl_coeff=0, so the reference would be scored every step "
            "and never used; set kl_coeff > 0 or drop ref_model"
        )
    scorer, kl = frozen_kl(ref_model, key="ref_logps", stat_key="kl_ref", length_normalize=length_normalize)
    loss = CompositeLoss(
        terms=[LossTerm(algo.name, algo.loss, 1.0), LossTerm("kl", kl, float(kl_coeff))], promote=("kl_ref",)
    )
    return RLAlgorithm(algo.name, algo.credit_assigner, loss, chain_preprocess(algo.preprocess, scorer))
