"""HybridNormalizedReturn's scale, as its docstring now says (issue 37): unit std over every rollout given;
after the tied groups are dropped the kept advantages have std sqrt(n_all / n_kept)."""

from __future__ import annotations

import math
import statistics

import pytest

from ludic.training.credit.assigners import HybridNormalizedReturn
from ludic.types import Rollout, Step


def _rollout(rid: str, reward: float, group: str) -> Rollout:
    return Rollout(
        id=rid,
        steps=[Step(0, "o", "a", "o", reward, False, True)],
        meta={"request_meta": {"group_id": group}},
    )


def test_kept_advantages_are_scaled_up_by_sqrt_all_over_kept_once_tied_groups_go():
    rewards = {
        "g0": [0.0, 1.0, 1.0, 0.0],
        "g1": [1.0, 0.0, 0.0, 0.0],
        "g2": [0.0, 0.5, 1.0, 0.5],
        "tied": [1.0] * 4,
    }
    rollouts = [_rollout(f"{g}-{i}", r, g) for g, rs in rewards.items() for i, r in enumerate(rs)]
    adv = HybridNormalizedReturn(group_size=4).compute(rollouts)
    assert statistics.pstdev(adv.values()) == pytest.approx(1.0, abs=1e-6)
    kept = [a for (rid, _), a in adv.items() if not rid.startswith("tied")]
    assert statistics.pstdev(kept) == pytest.approx(math.sqrt(16 / 12), abs=1e-6)  # x1.155
