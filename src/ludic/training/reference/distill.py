"""On-policy distillation: the student samples, a frozen teacher scores the student's tokens.

Loss (per-token reverse KL to the teacher, as in GKD, Agarwal et al. 2024, and Thinking Machines'
"On-Policy Distillation", 2025): on tokens ``x_t`` the student sampled,

    L = mean_i[ red_t( (log pi(x_t) - log teacher(x_t))^2 / 2 ) ]          (k2, ``TokenKLLoss``)
    grad L = mean_i[ red_t( (log pi(x_t) - log teacher(x_t)) * grad log pi(x_t) ) ]

whose expectation over the student's samples is the gradient of ``KL(pi || teacher)`` at each position
(prefix held fixed: the per-token, discount-0 form; the sequence-level form would also sum the
future tokens' terms). No reward is needed; ``reward_coeff > 0`` adds a CISPO term on group-normalised
environment rewards (``(R - mean_group) / (std_group + 1e-8)``, as ``make_cispo``: ``presets``' table):
``L_total = L + reward_coeff * L_cispo``. Reported stat: ``kl_teacher``, the
mean per-token k3 estimate of KL(student || teacher).
"""

from __future__ import annotations

from ludic.training.algorithm import RLAlgorithm
from ludic.training.credit.assigners import ConstantCredit
from ludic.training.loss import CISPOLoss, CompositeLoss, LossTerm
from ludic.training.presets import build_preset, group_advantages
from ludic.training.reference.kl_penalty import RefModel, frozen_kl


def make_distill(
    teacher: RefModel,
    *,
    reward_coeff: float = 0.0,
    group_size: int = 8,
    length_normalize: bool = True,
    clip_eps_high: float = 0.2,
    name: str = "distill",
    teacher_device: str | None = None,
    micro_token_budget: int = 16384,
) -> RLAlgorithm:
    """On-policy distillation from ``teacher`` (a model directory, nn.Module or ``FrozenModelScorer``).

    ``reward_coeff``: weight of an environment-reward CISPO term (0: pure distillation, no reward read;
    then ``group_size`` is unused). ``length_normalize``: average each sequence's per-token KL
    (default) rather than sum it. ``teacher_device`` / ``micro_token_budget``: where a teacher
    given as a directory or module runs, and its padded tokens per forward (``ludic train`` sets
    them from ``[model].device`` and ``[trainer].micro_token_budget``).
    """
    if teacher is None:
        raise ValueError("make_distill needs teacher=...: a save_pretrained directory, nn.Module or scorer")
    if not isinstance(reward_coeff, (int, float)) or isinstance(reward_coeff, bool) or not reward_coeff >= 0:
        raise ValueError(f"make_distill: reward_coeff must be a number >= 0, got {reward_coeff!r}")
    scorer, kl = frozen_kl(
        teacher, key="teacher_logps", stat_key="kl_teacher", length_normalize=length_normalize,
        device=teacher_device, micro_token_budget=micro_token_budget,
    )  # fmt: skip
    if reward_coeff == 0:
        return build_preset(name, ConstantCredit(1.0), kl, ratio=False, scorers=[scorer])
    cispo = CISPOLoss(clip_eps_high=clip_eps_high, length_normalize=length_normalize)
    loss = CompositeLoss(
        terms=[LossTerm("distill", kl, 1.0), LossTerm("reward", cispo, float(reward_coeff))],
        promote=("kl_teacher",),
    )
    return build_preset(name, group_advantages(group_size), loss, scorers=[scorer])
