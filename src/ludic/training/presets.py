"""Algorithm presets with the migration guide's keywords and defaults (credit + loss + preprocess).

``tis_cap`` / ``mis_threshold`` (inference/trainer mismatch guards, see ``loss.mismatch``) are
additions to the guide's keywords; both default to off. Every RL preset takes ``kl_coeff`` and
``ref_model``: ``kl_coeff > 0`` adds a KL term to that frozen reference (``training/reference.py``).
Preprocessing filters first (zero-variance groups, zero weights) and validates what is left, so an
item that would be dropped anyway never fails validation.
"""

from __future__ import annotations

from ludic.training.algorithm import (
    RLAlgorithm,
    center_weights,
    chain_preprocess,
    drop_zero_variance_groups,
    drop_zero_weight,
    validate_actor_logps,
)
from ludic.training.credit_assignment import (
    ConstantCredit,
    GroupNormalizedReturn,
    HybridNormalizedReturn,
    MonteCarloReturn,
)
from ludic.training.loss import (
    CISPOLoss,
    ClippedSurrogateLoss,
    MaskedCausalLMCrossEntropyLoss,
    ReinforceLoss,
    TokenClippedSurrogateLoss,
)
from ludic.training.reference import RefModel, add_kl_penalty


def _ratio_preprocess(drop_zero: bool, *extra):
    return chain_preprocess(*extra, drop_zero_weight if drop_zero else None, validate_actor_logps)


def make_reinforce(
    gamma: float = 1.0,
    drop_zero_weight: bool = False,
    name: str = "reinforce",
    *,
    length_normalize: bool = False,
    tis_cap: float | None = None,
    mis_threshold: float | None = None,
    kl_coeff: float = 0.0,
    ref_model: RefModel | None = None,
) -> RLAlgorithm:
    """Monte Carlo returns + REINFORCE with the sequence-level IS correction."""
    loss = ReinforceLoss(length_normalize=length_normalize, tis_cap=tis_cap, mis_threshold=mis_threshold)
    algo = RLAlgorithm(name, MonteCarloReturn(gamma=gamma), loss, _ratio_preprocess(drop_zero_weight))
    return add_kl_penalty(algo, kl_coeff=kl_coeff, ref_model=ref_model, length_normalize=length_normalize, preset=name)


def make_reinforce_baseline(
    gamma: float = 1.0,
    normalize_adv: bool = False,
    drop_zero_weight: bool = False,
    name: str = "reinforce_baseline",
    *,
    length_normalize: bool = False,
    tis_cap: float | None = None,
    mis_threshold: float | None = None,
    kl_coeff: float = 0.0,
    ref_model: RefModel | None = None,
) -> RLAlgorithm:
    """Monte Carlo returns minus the macro-batch mean (``/ std`` if ``normalize_adv``) + REINFORCE.

    The baseline is applied in preprocessing over the whole macro-batch (not per micro-batch as
    ``ReinforceBaselineLoss`` would), so gradients do not depend on the token-budget split.
    """
    loss = ReinforceLoss(length_normalize=length_normalize, tis_cap=tis_cap, mis_threshold=mis_threshold)
    preprocess = _ratio_preprocess(drop_zero_weight, center_weights(normalize=normalize_adv))
    algo = RLAlgorithm(name, MonteCarloReturn(gamma=gamma), loss, preprocess)
    return add_kl_penalty(algo, kl_coeff=kl_coeff, ref_model=ref_model, length_normalize=length_normalize, preset=name)


def make_grpo(
    group_size: int = 8,
    group_normalize_adv: bool = True,
    positive_only: bool = False,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.27,
    length_normalize: bool = False,
    ratio_clip: float | None = None,
    drop_zero_weight: bool = False,
    name: str = "grpo",
    *,
    tis_cap: float | None = None,
    mis_threshold: float | None = None,
    kl_coeff: float = 0.0,
    ref_model: RefModel | None = None,
) -> RLAlgorithm:
    """Group-normalised returns + token-level PPO clipping."""
    credit = GroupNormalizedReturn(group_size, normalize_adv=group_normalize_adv, positive_only=positive_only)
    loss = TokenClippedSurrogateLoss(
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        length_normalize=length_normalize,
        ratio_clip=ratio_clip,
        tis_cap=tis_cap,
        mis_threshold=mis_threshold,
    )
    algo = RLAlgorithm(name, credit, loss, _ratio_preprocess(drop_zero_weight))
    return add_kl_penalty(algo, kl_coeff=kl_coeff, ref_model=ref_model, length_normalize=length_normalize, preset=name)


def make_gspo(
    group_size: int = 8,
    group_normalize_adv: bool = True,
    positive_only: bool = False,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float = 4e-4,
    length_normalize: bool = True,
    ratio_clip: float | None = None,
    drop_zero_weight: bool = False,
    name: str = "gspo",
    *,
    tis_cap: float | None = None,
    mis_threshold: float | None = None,
    kl_coeff: float = 0.0,
    ref_model: RefModel | None = None,
) -> RLAlgorithm:
    """Group-normalised returns + sequence-level clipping with a geometric-mean ratio."""
    credit = GroupNormalizedReturn(group_size, normalize_adv=group_normalize_adv, positive_only=positive_only)
    loss = ClippedSurrogateLoss(
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        length_normalize=length_normalize,
        ratio_clip=ratio_clip,
        tis_cap=tis_cap,
        mis_threshold=mis_threshold,
    )
    algo = RLAlgorithm(name, credit, loss, _ratio_preprocess(drop_zero_weight))
    return add_kl_penalty(algo, kl_coeff=kl_coeff, ref_model=ref_model, length_normalize=length_normalize, preset=name)


def _cispo_loss(
    clip_eps_low: float,
    clip_eps_high: float,
    length_normalize: bool,
    tis_cap: float | None,
    mis_threshold: float | None,
) -> CISPOLoss:
    return CISPOLoss(
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        length_normalize=length_normalize,
        tis_cap=tis_cap,
        mis_threshold=mis_threshold,
    )


def make_cispo(
    group_size: int = 8,
    group_normalize_adv: bool = True,
    positive_only: bool = False,
    clip_eps_low: float = 1e6,
    clip_eps_high: float = 0.2,
    length_normalize: bool = True,
    drop_zero_weight: bool = False,
    name: str = "cispo",
    kl_coeff: float = 0.0,
    *,
    tis_cap: float | None = None,
    mis_threshold: float | None = None,
    ref_model: RefModel | None = None,
) -> RLAlgorithm:
    """Group-normalised returns + CISPO; ``kl_coeff > 0`` adds a KL term to ``ref_model``."""
    credit = GroupNormalizedReturn(group_size, normalize_adv=group_normalize_adv, positive_only=positive_only)
    loss = _cispo_loss(clip_eps_low, clip_eps_high, length_normalize, tis_cap, mis_threshold)
    algo = RLAlgorithm(name, credit, loss, _ratio_preprocess(drop_zero_weight))
    return add_kl_penalty(algo, kl_coeff=kl_coeff, ref_model=ref_model, length_normalize=length_normalize, preset=name)


def make_scalerl(
    group_size: int = 8,
    filter_zvp: bool = True,
    positive_only: bool = False,
    clip_eps_low: float = 1e6,
    clip_eps_high: float = 0.2,
    length_normalize: bool = True,
    drop_zero_weight: bool = False,
    name: str = "scalerl",
    *,
    tis_cap: float | None = None,
    mis_threshold: float | None = None,
    kl_coeff: float = 0.0,
    ref_model: RefModel | None = None,
) -> RLAlgorithm:
    """ScaleRL: group-mean / batch-std advantages + CISPO; ``filter_zvp`` drops zero-variance prompts."""
    credit = HybridNormalizedReturn(group_size, positive_only=positive_only)
    loss = _cispo_loss(clip_eps_low, clip_eps_high, length_normalize, tis_cap, mis_threshold)
    zvp = drop_zero_variance_groups if filter_zvp else None
    algo = RLAlgorithm(name, credit, loss, _ratio_preprocess(drop_zero_weight, zvp))
    return add_kl_penalty(algo, kl_coeff=kl_coeff, ref_model=ref_model, length_normalize=length_normalize, preset=name)


def make_sft(length_normalize: bool = False, name: str = "sft") -> RLAlgorithm:
    """Constant credit 1.0 + masked NLL: supervised fine-tuning on the action tokens."""
    return RLAlgorithm(name, ConstantCredit(1.0), MaskedCausalLMCrossEntropyLoss(length_normalize), None)
