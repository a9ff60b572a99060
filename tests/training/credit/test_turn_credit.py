import pytest

from ludic.training import PerTurnReturn
from ludic.types import Rollout, Step


def _rollout(rid, rewards, group="g"):
    steps = [Step(i, "o", "a", None, r, False, i == len(rewards) - 1) for i, r in enumerate(rewards)]
    return Rollout(id=rid, steps=steps, meta={"request_meta": {"group_id": group}})


def test_each_turn_gets_its_discounted_reward_to_go():
    credit = PerTurnReturn(gamma=0.5).compute([_rollout("a", [1.0, 0.0, 4.0])])
    # G_2 = 4; G_1 = 0 + 0.5 * 4 = 2; G_0 = 1 + 0.5 * 2 = 2
    assert credit == {("a", 0): 2.0, ("a", 1): 2.0, ("a", 2): 4.0}


def test_group_normalisation_is_per_turn_index_and_skips_turns_only_one_reached():
    rollouts = [_rollout("a", [0.0, 1.0]), _rollout("b", [0.0, 0.0, 3.0])]
    credit = PerTurnReturn(gamma=1.0, group_size=2).compute(rollouts)
    # turn 0: G = 1 (a), 3 (b), mean 2; turn 1: G = 1 (a), 3 (b), mean 2; turn 2: only b
    assert credit == {("a", 0): -1.0, ("a", 1): -1.0, ("b", 0): 1.0, ("b", 1): 1.0, ("b", 2): 0.0}
    scaled = PerTurnReturn(group_size=2, normalize_adv=True).compute(rollouts)
    assert scaled[("a", 0)] == pytest.approx(-1.0) and scaled[("b", 2)] == 0.0
    assert PerTurnReturn(group_size=2, positive_only=True).compute(rollouts)[("a", 1)] == 0.0


def test_per_turn_return_rejects_bad_settings_and_partial_groups():
    with pytest.raises(ValueError, match="gamma must be in"):
        PerTurnReturn(gamma=1.5)
    with pytest.raises(ValueError, match="normalize_adv=True\\) needs group_size"):
        PerTurnReturn(normalize_adv=True)
    with pytest.raises(ValueError, match="has 1 rollouts, expected group_size=2"):
        PerTurnReturn(group_size=2).compute([_rollout("a", [1.0])])
