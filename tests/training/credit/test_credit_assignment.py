import pytest

from ludic.training.credit.assigners import (
    ConstantCredit,
    EpisodicReturn,
    GroupNormalizedReturn,
    HybridNormalizedReturn,
    MonteCarloReturn,
    PerStepReward,
)
from ludic.types import Rollout, Step


def rollout(rid: str, rewards: list[float], group=None, agent=None) -> Rollout:
    steps = [Step(i, "o", "a", "o", r, False, i == len(rewards) - 1) for i, r in enumerate(rewards)]
    meta = {} if group is None else {"request_meta": {"group_id": group}}
    if agent is not None:
        meta["agent_id"] = agent
    return Rollout(id=rid, steps=steps, meta=meta)


def one_step_groups(groups: dict[str, list[float]]) -> list[Rollout]:
    """One single-step rollout per reward, in its named group, with ids "a", "b", "c", ... in order."""
    ids = iter("abcdefgh")
    return [rollout(next(ids), [r], group) for group, rewards in groups.items() for r in rewards]


def test_monte_carlo_return_discounts_reward_to_go():
    out = MonteCarloReturn(gamma=0.5).compute([rollout("a", [1.0, 0.0, 4.0])])
    assert out == {("a", 0): 2.0, ("a", 1): 2.0, ("a", 2): 4.0}


def test_monte_carlo_undiscounted_is_suffix_sum():
    out = MonteCarloReturn().compute([rollout("a", [1.0, 2.0, 3.0])])
    assert out == {("a", 0): 6.0, ("a", 1): 5.0, ("a", 2): 3.0}


def test_group_normalized_return_subtracts_group_mean():
    rs = one_step_groups({"g1": [1.0, 3.0], "g2": [0.0, 0.0]})  # a, b in g1; c, d in g2
    out = GroupNormalizedReturn(group_size=2).compute(rs)
    assert out == {("a", 0): -1.0, ("b", 0): 1.0, ("c", 0): 0.0, ("d", 0): 0.0}


def test_group_normalized_return_divides_by_std_plus_eps_and_clamps_positive():
    rs = [rollout("a", [1.0], "g"), rollout("b", [3.0], "g")]
    out = GroupNormalizedReturn(group_size=2, normalize_adv=True).compute(rs)
    assert out[("a", 0)] == pytest.approx(-1.0 / (1.0 + 1e-8))
    pos = GroupNormalizedReturn(group_size=2, normalize_adv=True, positive_only=True).compute(rs)
    assert pos[("a", 0)] == 0.0
    assert pos[("b", 0)] == pytest.approx(1.0)


def test_group_normalized_return_gives_every_step_the_rollout_advantage():
    rs = [rollout("a", [1.0, 1.0], "g"), rollout("b", [0.0, 0.0], "g")]
    out = GroupNormalizedReturn(group_size=2).compute(rs)
    assert out == {("a", 0): 1.0, ("a", 1): 1.0, ("b", 0): -1.0, ("b", 1): -1.0}


def test_group_normalized_return_rejects_partial_groups():
    rs = [rollout("a", [1.0], "g"), rollout("b", [3.0], "g"), rollout("c", [3.0], "h")]
    with pytest.raises(ValueError, match=r"group \(group_id='h'\) has 1 rollouts, expected group_size=2"):
        GroupNormalizedReturn(group_size=2).compute(rs)


def test_group_normalized_return_rejects_missing_group_id():
    with pytest.raises(ValueError, match=r"rollout 'a' has no .*group_id"):
        GroupNormalizedReturn(group_size=1).compute([rollout("a", [1.0])])


@pytest.mark.parametrize("bad", [0, -2])
def test_group_size_must_be_positive(bad):
    with pytest.raises(ValueError, match="group_size"):
        GroupNormalizedReturn(group_size=bad)


def test_groups_are_split_per_agent_in_multi_agent_rollouts():
    rs = [
        rollout("a", [1.0], "g", "p0"),
        rollout("b", [3.0], "g", "p0"),
        rollout("c", [5.0], "g", "p1"),
        rollout("d", [5.0], "g", "p1"),
    ]
    out = GroupNormalizedReturn(group_size=2).compute(rs)
    assert out == {("a", 0): -1.0, ("b", 0): 1.0, ("c", 0): 0.0, ("d", 0): 0.0}


def test_hybrid_uses_group_mean_and_batch_std():
    # centred advantages: g1 -> -1, +1 ; g2 -> -3, +3 ; batch pstd = sqrt((1+1+9+9)/4) = sqrt(5)
    rs = one_step_groups({"g1": [1.0, 3.0], "g2": [0.0, 6.0]})  # a, b in g1; c, d in g2
    out = HybridNormalizedReturn(group_size=2).compute(rs)
    s = 5**0.5 + 1e-8
    assert out[("a", 0)] == pytest.approx(-1 / s)
    assert out[("d", 0)] == pytest.approx(3 / s)


def test_constant_episodic_and_per_step_credit():
    rs = [rollout("a", [1.0, 2.0])]
    assert ConstantCredit(value=0.5).compute(rs) == {("a", 0): 0.5, ("a", 1): 0.5}
    assert EpisodicReturn().compute(rs) == {("a", 0): 3.0, ("a", 1): 3.0}
    assert PerStepReward().compute(rs) == {("a", 0): 1.0, ("a", 1): 2.0}
