"""Algorithm presets with the migration guide's keywords and defaults (credit + loss + preprocess).

Every preset is one call to ``build_preset``, which owns what they share: the preprocessing order
(filters first, then zero-weight items, then actor-logprob validation, so an item dropped anyway never
fails validation) and the KL term to a frozen reference (``kl_coeff`` / ``ref_model``, wired once in
``training/reference/kl_penalty.py``). A new preset is a credit assigner, a loss and one ``build_preset`` call.
The signatures stay explicit so ``ludic train``'s preflight can check a config's keywords against them.

Advantage normalisation, in one place (the credit assigner each preset gets):

==========================  =====================================================================
preset                      advantage ``A_i``
==========================  =====================================================================
reinforce                   ``R_i``, the Monte Carlo return (the algorithm has no baseline)
reinforce_baseline          ``R_i - mean_batch(R)`` (``/ std_batch`` with ``normalize_adv``)
grpo, gspo, cispo, distill  ``(R_i - mean_group(R)) / (std_group(R) + 1e-8)`` (``group_advantages``)
scalerl                     ``(R_i - mean_group(R)) / (std_batch + 1e-8)`` (the ScaleRL recipe)
sft, distill (no reward)    ``1`` (no reward is read)
==========================  =====================================================================

``tis_cap`` / ``mis_threshold`` (inference/trainer mismatch guards, see ``loss.mismatch``) are
additions to the guide's keywords; both default to off.
"""

from __future__ import annotations

from collections.abc import Sequence

from ludic.training import algorithm as alg
from ludic.training.algorithm import PreprocessFn, RLAlgorithm
from ludic.training.credit.assigners import (
    ConstantCredit,
    GroupNormalizedReturn,
    HybridNormalizedReturn,
    MonteCarloReturn,
)
from ludic.training.credit.group_token_mean import group_token_mean as reweight_group_token_mean
from ludic.training.loss import Loss, MaskedCausalLMCrossEntropyLoss, ReinforceLoss
from ludic.training.loss.cispo import CISPOLoss
from ludic.training.loss.clipped import ClippedSurrogateLoss, TokenClippedSurrogateLoss
from ludic.training.reference.kl_penalty import RefModel, add_kl_penalty
from ludic.training.types import CreditAssigner


def build_preset(
    name: str,
    credit: CreditAssigner,
    loss: Loss,
    *,
    filters: Sequence[PreprocessFn | None] = (),
    drop_zero_weight: bool = False,
    ratio: bool = True,
    scorers: Sequence[PreprocessFn] = (),
    kl_coeff: float = 0.0,
    ref_model: RefModel | None = None,
    length_normalize: bool | None = None,
) -> RLAlgorithm:
    """``RLAlgorithm(name, credit, loss)`` with the presets' shared preprocessing and KL term.

    Preprocess order: ``filters`` (e.g. zero-variance groups), zero-weight items (``drop_zero_weight``),
    actor-logprob validation (``ratio``: the loss reads importance ratios), then ``scorers`` (frozen
    models filling ``batch["teacher_logps"]``...), then the reference scorer when ``kl_coeff > 0``:
    only items that are trained on get scored. ``length_normalize`` is the KL term's reduction (by
    default the loss's own ``length_normalize``, so the KL term is reduced like the loss).
    """
    if length_normalize is None:
        length_normalize = bool(getattr(loss, "length_normalize", False))
    preprocess = alg.chain_preprocess(
        *filters,
        alg.drop_zero_weight if drop_zero_weight else None,
        alg.validate_actor_logps if ratio else None,
        *scorers,
    )
    algo = RLAlgorithm(name, credit, loss, preprocess)
    return add_kl_penalty(algo, kl_coeff=kl_coeff, ref_model=ref_model, length_normalize=length_normalize, preset=name)


def group_advantages(group_size: int, normalize: bool = True, positive_only: bool = False) -> GroupNormalizedReturn:
    """The group presets' credit: ``(R - mean_group) / (std_group + 1e-8)`` (centred only if not ``normalize``)."""
    return GroupNormalizedReturn(group_size, normalize_adv=normalize, positive_only=positive_only)


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
    credit = MonteCarloReturn(gamma=gamma)
    return build_preset(name, credit, loss, drop_zero_weight=drop_zero_weight, kl_coeff=kl_coeff, ref_model=ref_model)


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
    baseline = alg.center_weights(normalize=normalize_adv)
    return build_preset(
        name, MonteCarloReturn(gamma=gamma), loss, filters=[baseline], drop_zero_weight=drop_zero_weight,
        kl_coeff=kl_coeff, ref_model=ref_model,
    )  # fmt: skip


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
    loss = TokenClippedSurrogateLoss(
        clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, length_normalize=length_normalize,
        ratio_clip=ratio_clip, tis_cap=tis_cap, mis_threshold=mis_threshold,
    )  # fmt: skip
    credit = group_advantages(group_size, group_normalize_adv, positive_only)
    return build_preset(name, credit, loss, drop_zero_weight=drop_zero_weight, kl_coeff=kl_coeff, ref_model=ref_model)


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
    loss = ClippedSurrogateLoss(
        clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, length_normalize=length_normalize,
        ratio_clip=ratio_clip, tis_cap=tis_cap, mis_threshold=mis_threshold,
    )  # fmt: skip
    credit = group_advantages(group_size, group_normalize_adv, positive_only)
    return build_preset(name, credit, loss, drop_zero_weight=drop_zero_weight, kl_coeff=kl_coeff, ref_model=ref_model)


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
    group_token_mean: bool = False,
) -> RLAlgorithm:
    """Group-normalised returns + CISPO; ``kl_coeff > 0`` adds a KL term to ``ref_model``.

    ``group_token_mean=True`` (with ``length_normalize=False``) aggregates as MiniMax-M1's eq. 4: each
    group's token terms divided by its total action tokens, then averaged over groups
    (``credit/group_token_mean.py``); the default averages each reply over its tokens, then over replies."""
    loss = CISPOLoss(
        clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, length_normalize=length_normalize,
        tis_cap=tis_cap, mis_threshold=mis_threshold,
    )  # fmt: skip
    credit = group_advantages(group_size, group_normalize_adv, positive_only)
    return build_preset(
        name, credit, loss, drop_zero_weight=drop_zero_weight, kl_coeff=kl_coeff, ref_model=ref_model,
        scorers=_group_token_mean(group_token_mean, length_normalize, name),
    )  # fmt: skip


def _group_token_mean(on: bool, length_normalize: bool, name: str) -> list[PreprocessFn]:
    """The reweighting step for ``group_token_mean=True`` (after every filter, so the scale counts only the
    items trained on); it needs a loss that sums over tokens."""
    if not isinstance(on, bool):
        raise TypeError(f"{name}: group_token_mean must be a bool, got {on!r}")
    if on and length_normalize:
        raise ValueError(
            f"{name}: group_token_mean=True divides each group by its token count itself; "
            "set length_normalize=False (a loss that sums over each reply's tokens)"
        )
    return [reweight_group_token_mean] if on else []


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
    group_token_mean: bool = False,
) -> RLAlgorithm:
    """ScaleRL: group-mean / batch-std advantages + CISPO; ``filter_zvp`` drops zero-variance prompts.

    Aggregation: the loss averages each reply over its tokens, then over the batch's replies
    (``length_normalize=True``, CISPO's ``red_t`` then ``mean_i``). ScaleRL's prompt-level aggregation
    instead averages over all the tokens of a prompt's group, then over prompts. With whole groups of
    ``group_size`` replies the two agree when a group's replies have equal lengths; otherwise ScaleRL
    gives each token of a group the same weight (a long reply counts more), Ludic each reply the same.
    ``length_normalize=False`` gives every token of the batch the same weight instead, and with
    ``group_token_mean=True`` too, ScaleRL's prompt-level aggregation exactly (``credit/group_token_mean.py``)."""
    loss = CISPOLoss(
        clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, length_normalize=length_normalize,
        tis_cap=tis_cap, mis_threshold=mis_threshold,
    )  # fmt: skip
    return build_preset(
        name, HybridNormalizedReturn(group_size, positive_only=positive_only), loss,
        filters=[alg.drop_zero_variance_groups if filter_zvp else None], drop_zero_weight=drop_zero_weight,
        kl_coeff=kl_coeff, ref_model=ref_model, scorers=_group_token_mean(group_token_mean, length_normalize, name),
    )  # fmt: skip


def make_sft(length_normalize: bool = False, name: str = "sft") -> RLAlgorithm:
    """Constant credit 1.0 + masked NLL: supervised fine-tuning on the action tokens."""
    return build_preset(name, ConstantCredit(1.0), MaskedCausalLMCrossEntropyLoss(length_normalize), ratio=False)
