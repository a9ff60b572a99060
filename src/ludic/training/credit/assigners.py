"""Credit assigners: how rewards become one scalar weight per step, keyed ``(rollout.id, step.index)``.

Group-based assigners form groups from ``rollout.meta["request_meta"]["group_id"]`` (the same prompt
sampled ``group_size`` times) and, in multi-agent games, per ``rollout.meta["agent_id"]``: a group of
the wrong size is an error, never a silent mis-normalisation.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from ludic.training.types import RolloutStepKey
from ludic.types import Rollout

ADV_EPS = 1e-8
"""Added to every standard deviation before dividing by it."""


def check_rollouts(rollouts: list[Rollout]) -> list[Rollout]:
    """``rollouts``, refused with ValueError if two share an id or a step index (their credit keys
    ``(rollout.id, step.index)`` would collide, one silently overwriting the other) or a reward is NaN/inf
    (it would reach the loss as a NaN weight, or poison its whole group's mean and std)."""
    for rid, count in Counter(r.id for r in rollouts).items():
        if count > 1:
            raise ValueError(
                f"rollout id {rid!r} appears {count} times in the batch; credit is keyed (rollout.id, "
                "step.index), so each rollout needs its own id (copy a rollout with a fresh id to reuse it)"
            )
    for r in rollouts:
        indices = [s.index for s in r.steps]
        if len(set(indices)) != len(indices):
            raise ValueError(
                f"rollout {r.id!r} has repeated step indices {indices}; each step needs its own index"
            )
        for s in r.steps:
            if not math.isfinite(s.reward):
                raise ValueError(
                    f"rollout {r.id!r} step {s.index} has a non-finite reward ({s.reward!r}); fix the env or "
                    "reward function, or drop the rollout before credit assignment"
                )
    return rollouts


def group_mean(values: list[float]) -> float:
    """The correctly rounded mean: ``fmean`` rounds its sum first, so n tied rewards could centre to
    +-1 ulp instead of 0, which ``/ (std + 1e-8)`` then blows up (11.9 for five rewards of 858993459.9999999)."""
    return float(statistics.mean(values))


def _per_rollout(rollouts: list[Rollout], values: dict[str, float]) -> dict[RolloutStepKey, float]:
    """Give every step of a rollout its rollout's value."""
    return {(r.id, s.index): values[r.id] for r in rollouts for s in r.steps}


def _group_key(rollout: Rollout) -> tuple[Any, Any]:
    request_meta = rollout.meta.get("request_meta")
    if not isinstance(request_meta, dict) or "group_id" not in request_meta:
        raise ValueError(
            f"rollout {rollout.id!r} has no rollout.meta['request_meta']['group_id']; group-normalised "
            "credit needs each request's meta to carry a group_id shared by the group's samples"
        )
    return request_meta["group_id"], rollout.meta.get("agent_id")


def group_rollouts(rollouts: list[Rollout], group_size: int) -> list[list[Rollout]]:
    """Rollouts grouped by (group_id, agent_id); every group must hold exactly ``group_size``."""
    if not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    groups: dict[tuple[Any, Any], list[Rollout]] = defaultdict(list)
    for rollout in rollouts:
        groups[_group_key(rollout)].append(rollout)
    for (gid, agent), members in groups.items():
        if len(members) != group_size:
            who = f"group_id={gid!r}" + (f", agent_id={agent!r}" if agent is not None else "")
            raise ValueError(
                f"group ({who}) has {len(members)} rollouts, expected group_size={group_size}; "
                "make num_episodes match group_size or drop incomplete groups before credit assignment"
            )
    return list(groups.values())


def _check_gamma(gamma: float) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")


@dataclass
class MonteCarloReturn:
    """``G_t = sum_k gamma^k r_{t+k}``: the discounted reward-to-go within the rollout (REINFORCE)."""

    gamma: float = 1.0

    def __post_init__(self) -> None:
        _check_gamma(self.gamma)

    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]:
        out: dict[RolloutStepKey, float] = {}
        for r in check_rollouts(rollouts):
            g = 0.0
            for step in reversed(r.steps):
                g = step.reward + self.gamma * g
                out[(r.id, step.index)] = g
        return out


@dataclass
class GroupNormalizedReturn:
    """GRPO: ``A_i = R_i - mean_group(R)``; ``/ (std_group(R) + 1e-8)`` when ``normalize_adv``.

    ``R_i`` is the rollout's total reward; every step of the rollout gets ``A_i``; the std is the
    population std (ddof 0); ``positive_only`` clamps advantages at 0.
    """

    group_size: int
    normalize_adv: bool = False
    positive_only: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.group_size, int) or self.group_size <= 0:
            raise ValueError(
                f"GroupNormalizedReturn.group_size must be a positive int, got {self.group_size!r}"
            )

    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]:
        adv: dict[str, float] = {}
        for group in group_rollouts(check_rollouts(rollouts), self.group_size):
            rewards = [r.total_reward for r in group]
            mean = group_mean(rewards)
            scale = statistics.pstdev(rewards) + ADV_EPS if self.normalize_adv else 1.0
            for r, reward in zip(group, rewards):
                a = (reward - mean) / scale
                adv[r.id] = max(a, 0.0) if self.positive_only else a
        return _per_rollout(rollouts, adv)


@dataclass
class HybridNormalizedReturn:
    """ScaleRL: group-mean baseline, batch-level scale: ``A_i = (R_i - mean_group(R)) / (std_batch(A) + 1e-8)``.

    ``std_batch`` is the population std of the group-centred advantages over every rollout given,
    groups whose samples all scored the same included (their A is 0). So the advantages of the whole
    batch have unit population std; where a filter then drops the tied groups (``make_scalerl``'s
    ``filter_zvp``), the kept ones have std ``sqrt(n_all / n_kept)``, above 1 (x1.155 when a quarter of
    the rollouts were in tied groups).
    """

    group_size: int
    positive_only: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.group_size, int) or self.group_size <= 0:
            raise ValueError(
                f"HybridNormalizedReturn.group_size must be a positive int, got {self.group_size!r}"
            )

    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]:
        centred: dict[str, float] = {}
        for group in group_rollouts(check_rollouts(rollouts), self.group_size):
            mean = group_mean([r.total_reward for r in group])
            centred.update({r.id: r.total_reward - mean for r in group})
        scale = (statistics.pstdev(centred.values()) if centred else 0.0) + ADV_EPS
        adv = {rid: a / scale for rid, a in centred.items()}
        if self.positive_only:
            adv = {rid: max(a, 0.0) for rid, a in adv.items()}
        return _per_rollout(rollouts, adv)


@dataclass
class ConstantCredit:
    """Every step gets ``value`` (SFT, or behaviour cloning of filtered rollouts)."""

    value: float = 1.0

    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]:
        return {(r.id, s.index): float(self.value) for r in rollouts for s in r.steps}


@dataclass
class EpisodicReturn:
    """Every step gets the episode's total reward (undiscounted, no baseline)."""

    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]:
        return _per_rollout(rollouts, {r.id: r.total_reward for r in check_rollouts(rollouts)})


@dataclass
class PerStepReward:
    """Every step gets its own immediate reward (bandit-style credit)."""

    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]:
        return {(r.id, s.index): float(s.reward) for r in check_rollouts(rollouts) for s in r.steps}
