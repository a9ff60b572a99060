"""Per-turn credit for multi-turn episodes: each turn gets its own return.

``G_t = sum_{k>=0} gamma^k r_{t+k}``: the discounted reward-to-go from turn t of the rollout. With
``group_size`` set, returns are baselined per turn index across the group (the same prompt sampled
``group_size`` times): ``A_{i,t} = G_{i,t} - mean_{j reached t}(G_{j,t})``, divided by
``std_{j reached t}(G_{j,t}) + 1e-8`` when ``normalize_adv``. Rollouts of different lengths are
compared only at the turn indices they share; a turn reached by one rollout alone gets A = 0.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from ludic.training.credit.assigners import ADV_EPS, check_rollouts, group_mean, group_rollouts
from ludic.training.types import RolloutStepKey
from ludic.types import Rollout


def reward_to_go(rollout: Rollout, gamma: float) -> list[float]:
    """``[G_0, ..., G_{T-1}]`` for the rollout's steps in order."""
    returns, g = [], 0.0
    for step in reversed(rollout.steps):
        g = step.reward + gamma * g
        returns.append(g)
    return returns[::-1]


@dataclass
class PerTurnReturn:
    """Each step (turn) gets its discounted reward-to-go, optionally group-normalised per turn index.

    gamma: discount in [0, 1]. group_size: None for raw returns; else the GRPO group size (groups
    by ``request_meta.group_id`` and agent id, as ``GroupNormalizedReturn``). normalize_adv: divide
    by the per-turn-index std of the group. positive_only: clamp the result at 0.
    """

    gamma: float = 1.0
    group_size: int | None = None
    normalize_adv: bool = False
    positive_only: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"PerTurnReturn.gamma must be in [0, 1], got {self.gamma!r}")
        if self.group_size is not None and (not isinstance(self.group_size, int) or self.group_size <= 0):
            raise ValueError(f"PerTurnReturn.group_size must be None or a positive int, got {self.group_size!r}")
        if self.normalize_adv and self.group_size is None:
            raise ValueError("PerTurnReturn(normalize_adv=True) needs group_size: it normalises within groups")

    def compute(self, rollouts: list[Rollout]) -> dict[RolloutStepKey, float]:
        returns = {r.id: reward_to_go(r, self.gamma) for r in check_rollouts(rollouts)}
        out: dict[RolloutStepKey, float] = {}
        if self.group_size is None:
            for r in rollouts:
                out.update({(r.id, s.index): g for s, g in zip(r.steps, returns[r.id], strict=True)})
        else:
            for group in group_rollouts(rollouts, self.group_size):
                out.update(self._group_advantages(group, returns))
        if self.positive_only:
            out = {k: max(v, 0.0) for k, v in out.items()}
        return out

    def _group_advantages(
        self, group: list[Rollout], returns: dict[str, list[float]]
    ) -> dict[RolloutStepKey, float]:
        by_turn: dict[int, list[float]] = defaultdict(list)
        for r in group:
            for t, g in enumerate(returns[r.id]):
                by_turn[t].append(g)
        out = {}
        for r in group:
            for t, (step, g) in enumerate(zip(r.steps, returns[r.id], strict=True)):
                peers = by_turn[t]
                a = g - group_mean(peers)
                if self.normalize_adv:
                    a /= statistics.pstdev(peers) + ADV_EPS
                out[(r.id, step.index)] = a
        return out
