"""Property-based tests of the credit assigners against straightforward float64 reference computations.

Contracts (API-NOTES "Credit assignment", the assigners' docstrings): ``MonteCarloReturn`` gives
``G_t = sum_k gamma^k r_{t+k}``; ``GroupNormalizedReturn`` gives every step of rollout i
``A_i = R_i - mean_group(R)`` (``/ (pstd_group(R) + 1e-8)`` when ``normalize_adv``), ``positive_only``
clamps at 0; groups are ``(request_meta.group_id, agent_id)`` and a group of the wrong size or a rollout
without a group id is a ``ValueError``. Credit is keyed ``(rollout.id, step.index)``, so it cannot depend
on the order rollouts arrive in, and two rollouts sharing an id (or a non-finite reward) are refused rather
than silently merged or propagated into the loss.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.training.algorithm import center_weights
from ludic.training.credit.assigners import (
    EpisodicReturn,
    GroupNormalizedReturn,
    HybridNormalizedReturn,
    MonteCarloReturn,
    PerStepReward,
)
from ludic.training.credit.per_turn import PerTurnReturn
from ludic.training.types import CreditAssigner, SAWBatch, SAWItem
from ludic.types import Rollout, Step

EPS = 1e-8
PROPS = settings()  # the suite's profile (tests/conftest.py): 200 examples, 500 under CI=true

# rewards on a 1/4 grid: sums, means and shifts of them are exact in float64, so invariances hold tightly
grid_rewards = st.integers(-40, 40).map(lambda k: k / 4)
any_rewards = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


def rollout(rid: str, rewards: list[float], group: object = None, agent: object = None) -> Rollout:
    steps = [Step(i, "o", "a", "o", r, False, i == len(rewards) - 1) for i, r in enumerate(rewards)]
    meta: dict = {} if group is None else {"request_meta": {"group_id": group}}
    if agent is not None:
        meta["agent_id"] = agent
    return Rollout(id=rid, steps=steps, meta=meta)


@st.composite
def grouped_batches(
    draw: st.DrawFn, rewards: st.SearchStrategy[float] = grid_rewards
) -> tuple[int, list[Rollout]]:
    """``(group_size, rollouts)``: 1-4 complete groups of 1-6 rollouts of 1-3 steps, in a random order."""
    group_size = draw(st.integers(1, 6))
    n_groups = draw(st.integers(1, 4))
    rollouts = [
        rollout(f"r{g}_{i}", draw(st.lists(rewards, min_size=1, max_size=3)), f"g{g}")
        for g in range(n_groups)
        for i in range(group_size)
    ]
    return group_size, draw(st.permutations(rollouts))


def reference_group_advantages(rollouts: list[Rollout], normalize: bool) -> dict[str, tuple[float, float]]:
    """``{rollout id: (A_i, tolerance)}`` by numpy float64 from ``math.fsum`` totals; the tolerance is a
    few ulps of the group's rewards (``R - mean`` cancels), magnified by the ``1 / (std + eps)`` scale."""
    by_group: dict[object, list[Rollout]] = {}
    for r in rollouts:
        by_group.setdefault(r.meta["request_meta"]["group_id"], []).append(r)
    out = {}
    for members in by_group.values():
        totals = np.array([math.fsum(s.reward for s in r.steps) for r in members], dtype=np.float64)
        scale = totals.std() + EPS if normalize else 1.0  # numpy's std is the population std (ddof 0)
        tol = 1e-12 * max(1.0, float(np.abs(totals).max())) / scale
        out.update({r.id: (float(a), tol) for r, a in zip(members, (totals - totals.mean()) / scale)})
    return out


# ---- group-normalised advantages -------------------------------------------------------------------------


@PROPS
@given(grouped_batches(any_rewards), st.booleans())
def test_group_advantages_match_the_reference_and_every_step_shares_its_rollouts(
    batch: tuple[int, list[Rollout]], normalize: bool
) -> None:
    group_size, rollouts = batch
    out = GroupNormalizedReturn(group_size, normalize_adv=normalize).compute(rollouts)
    ref = reference_group_advantages(rollouts, normalize)
    assert set(out) == {(r.id, s.index) for r in rollouts for s in r.steps}
    for r in rollouts:
        expected, tol = ref[r.id]
        for s in r.steps:
            assert out[(r.id, s.index)] == pytest.approx(expected, rel=1e-9, abs=tol)
            assert math.isfinite(out[(r.id, s.index)])


@PROPS
@given(grouped_batches(), st.booleans())
def test_group_advantages_have_zero_mean_per_group(batch: tuple[int, list[Rollout]], normalize: bool) -> None:
    group_size, rollouts = batch
    out = GroupNormalizedReturn(group_size, normalize_adv=normalize).compute(rollouts)
    for g in {r.meta["request_meta"]["group_id"] for r in rollouts}:
        adv = [out[(r.id, 0)] for r in rollouts if r.meta["request_meta"]["group_id"] == g]
        assert abs(math.fsum(adv) / len(adv)) <= 1e-9


@PROPS
@given(grouped_batches(), st.integers(-1000, 1000), st.booleans())
def test_group_advantages_ignore_a_constant_added_to_a_group(
    batch: tuple[int, list[Rollout]], shift: int, normalize: bool
) -> None:
    group_size, rollouts = batch
    shifted = [
        rollout(r.id, [s.reward + (shift if i == 0 else 0) for i, s in enumerate(r.steps)], group=r.meta["request_meta"]["group_id"])
        for r in rollouts
    ]  # fmt: skip
    credit = GroupNormalizedReturn(group_size, normalize_adv=normalize)
    assert credit.compute(shifted) == pytest.approx(credit.compute(rollouts), abs=1e-9)


@PROPS
@given(grouped_batches(), st.integers(-6, 10))
def test_normalised_group_advantages_ignore_positive_scaling(
    batch: tuple[int, list[Rollout]], log2: int
) -> None:
    group_size, rollouts = batch
    a = 2.0**log2  # exact scaling; the + 1e-8 is the only departure from exact invariance
    scaled = [
        rollout(r.id, [a * s.reward for s in r.steps], r.meta["request_meta"]["group_id"]) for r in rollouts
    ]
    credit = GroupNormalizedReturn(group_size, normalize_adv=True)
    assert credit.compute(scaled) == pytest.approx(credit.compute(rollouts), rel=1e-5, abs=1e-9)


TIED_ASSIGNERS: list[Callable[[int], CreditAssigner]] = [
    lambda n: GroupNormalizedReturn(n),
    lambda n: GroupNormalizedReturn(n, normalize_adv=True),
    lambda n: GroupNormalizedReturn(n, normalize_adv=True, positive_only=True),
    lambda n: HybridNormalizedReturn(n),
    lambda n: PerTurnReturn(group_size=n),
    lambda n: PerTurnReturn(gamma=0.9, group_size=n, normalize_adv=True),
]


@PROPS
@given(
    st.lists(st.floats(-1e9, 1e9, allow_nan=False), min_size=1, max_size=3),
    st.integers(1, 9),
    st.integers(1, 3),
    st.sampled_from(range(len(TIED_ASSIGNERS))),
)
def test_a_group_whose_rewards_all_tie_gets_exactly_zero_advantage(
    rewards: list[float], group_size: int, n_groups: int, which: int
) -> None:
    rollouts = [rollout(f"r{g}_{i}", rewards, f"g{g}") for g in range(n_groups) for i in range(group_size)]
    out = TIED_ASSIGNERS[which](group_size).compute(rollouts)
    assert len(out) == len(rollouts) * len(rewards)
    assert all(v == 0.0 for v in out.values()), out


@PROPS
@given(grouped_batches(), st.booleans())
def test_positive_only_is_the_unclamped_advantage_clamped_at_zero(
    batch: tuple[int, list[Rollout]], normalize: bool
) -> None:
    group_size, rollouts = batch
    raw = GroupNormalizedReturn(group_size, normalize_adv=normalize).compute(rollouts)
    pos = GroupNormalizedReturn(group_size, normalize_adv=normalize, positive_only=True).compute(rollouts)
    assert pos == {k: max(v, 0.0) for k, v in raw.items()}


@PROPS
@given(st.floats(-1e9, 1e9, allow_nan=False), st.integers(1, 9), st.booleans())
def test_the_batch_baseline_centres_tied_weights_to_exactly_zero(
    weight: float, n: int, normalize: bool
) -> None:
    items = [SAWItem([1, 2], [1, 1], [0, 1], weight, {"rollout_id": f"r{i}"}) for i in range(n)]
    batch = center_weights(normalize=normalize)(SAWBatch(items))
    assert [it.weight for it in batch.items] == [0.0] * n


@PROPS
@given(st.lists(any_rewards, min_size=1, max_size=12), st.booleans())
def test_the_batch_baseline_matches_the_reference(weights: list[float], normalize: bool) -> None:
    items = [SAWItem([1, 2], [1, 1], [0, 1], w, {"rollout_id": f"r{i}"}) for i, w in enumerate(weights)]
    batch = center_weights(normalize=normalize)(SAWBatch(items))
    w = np.array(weights, dtype=np.float64)
    scale = w.std() + EPS if normalize else 1.0
    tol = 1e-12 * max(1.0, float(np.abs(w).max())) / scale
    assert [it.weight for it in batch.items] == pytest.approx(list((w - w.mean()) / scale), rel=1e-9, abs=tol)


# ---- order and shape of the batch ----------------------------------------------------------------------

ORDER_ASSIGNERS: list[Callable[[int], CreditAssigner]] = [
    lambda n: GroupNormalizedReturn(n, normalize_adv=True),
    lambda n: HybridNormalizedReturn(n, positive_only=True),
    lambda n: PerTurnReturn(gamma=0.5, group_size=n, normalize_adv=True),
    lambda n: MonteCarloReturn(gamma=0.9),
    lambda n: EpisodicReturn(),
    lambda n: PerStepReward(),
]


@PROPS
@given(
    grouped_batches(any_rewards),
    st.randoms(use_true_random=False),
    st.sampled_from(range(len(ORDER_ASSIGNERS))),
)
def test_credit_does_not_depend_on_the_order_rollouts_arrive_in(
    batch: tuple[int, list[Rollout]], rng: random.Random, which: int
) -> None:
    group_size, rollouts = batch
    shuffled = list(rollouts)
    rng.shuffle(shuffled)
    credit = ORDER_ASSIGNERS[which](group_size)
    assert credit.compute(shuffled) == credit.compute(rollouts)


GROUPED: list[Callable[[int], CreditAssigner]] = [
    lambda n: GroupNormalizedReturn(n),
    lambda n: HybridNormalizedReturn(n),
    lambda n: PerTurnReturn(group_size=n),
]


@PROPS
@given(grouped_batches(), st.data(), st.sampled_from(range(len(GROUPED))))
def test_a_group_of_the_wrong_size_is_named(
    batch: tuple[int, list[Rollout]], data: st.DataObject, which: int
) -> None:
    group_size, rollouts = batch
    victim = data.draw(st.sampled_from(rollouts))
    gid = victim.meta["request_meta"]["group_id"]
    if data.draw(st.booleans()):
        broken = [r for r in rollouts if r is not victim]  # one sample of the group lost
        have = group_size - 1
    else:
        broken = [*rollouts, rollout("extra", [1.0], gid)]  # one sample too many
        have = group_size + 1
    if have == 0:
        return  # the whole group is gone: the rest is a valid batch
    with pytest.raises(
        ValueError, match=rf"group \(group_id='{gid}'\) has {have} rollouts, expected group_size={group_size}"
    ):
        GROUPED[which](group_size).compute(broken)


@PROPS
@given(grouped_batches(), st.data(), st.sampled_from(range(len(GROUPED))))
def test_a_rollout_without_a_group_id_is_named(
    batch: tuple[int, list[Rollout]], data: st.DataObject, which: int
) -> None:
    group_size, rollouts = batch
    victim = data.draw(st.sampled_from(rollouts))
    victim.meta = data.draw(st.sampled_from([{}, {"request_meta": {}}, {"request_meta": None}]))
    with pytest.raises(ValueError, match=rf"rollout '{victim.id}' has no .*group_id"):
        GROUPED[which](group_size).compute(rollouts)


ALL_ASSIGNERS: list[Callable[[int], CreditAssigner]] = [
    *GROUPED,
    lambda n: GroupNormalizedReturn(n, normalize_adv=True),
    lambda n: MonteCarloReturn(gamma=0.5),
    lambda n: EpisodicReturn(),
    lambda n: PerStepReward(),
    lambda n: PerTurnReturn(),
]


@PROPS
@given(grouped_batches(), st.data(), st.sampled_from(range(len(ALL_ASSIGNERS))))
def test_two_rollouts_sharing_an_id_are_refused(
    batch: tuple[int, list[Rollout]], data: st.DataObject, which: int
) -> None:
    group_size, rollouts = batch
    a, b = data.draw(st.sampled_from(rollouts)), data.draw(st.sampled_from(rollouts))
    b.id = a.id  # their credit would share the keys (id, step.index): one would silently overwrite the other
    if a is b:
        rollouts = [*rollouts, rollout(a.id, [0.0], a.meta["request_meta"]["group_id"])]
    with pytest.raises(ValueError, match=rf"rollout id '{a.id}' appears 2 times"):
        ALL_ASSIGNERS[which](group_size + (a is b)).compute(rollouts)


@PROPS
@given(
    grouped_batches(),
    st.data(),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.sampled_from(range(len(ALL_ASSIGNERS))),
)
def test_a_non_finite_reward_is_refused_naming_the_step(
    batch: tuple[int, list[Rollout]], data: st.DataObject, bad: float, which: int
) -> None:
    group_size, rollouts = batch
    victim = data.draw(st.sampled_from(rollouts))
    step = data.draw(st.sampled_from(victim.steps))
    step.reward = bad
    with pytest.raises(ValueError, match=rf"rollout '{victim.id}' step {step.index} has a non-finite reward"):
        ALL_ASSIGNERS[which](group_size).compute(rollouts)


@pytest.mark.parametrize("which", range(len(ALL_ASSIGNERS)))
def test_a_repeated_step_index_is_refused(which: int) -> None:
    twice = Rollout(
        id="a",
        steps=[Step(0, "o", "a", "o", 1.0, False, False)] * 2,
        meta={"request_meta": {"group_id": "g"}},
    )
    with pytest.raises(ValueError, match=r"rollout 'a' has repeated step indices \[0, 0\]"):
        ALL_ASSIGNERS[which](1).compute([twice])


@pytest.mark.parametrize("which", range(len(ALL_ASSIGNERS)))
def test_an_empty_batch_gets_no_credit(which: int) -> None:
    assert ALL_ASSIGNERS[which](4).compute([]) == {}


# ---- discounted returns ------------------------------------------------------------------------------------


@PROPS
@given(st.lists(any_rewards, min_size=1, max_size=12), st.floats(0.0, 1.0))
def test_monte_carlo_return_is_the_closed_form_discounted_sum(rewards: list[float], gamma: float) -> None:
    out = MonteCarloReturn(gamma=gamma).compute([rollout("a", rewards)])
    turns = PerTurnReturn(gamma=gamma).compute([rollout("a", rewards)])
    for t in range(len(rewards)):
        expected = math.fsum(gamma**k * r for k, r in enumerate(rewards[t:]))
        tol = 1e-12 * (1 + math.fsum(abs(r) for r in rewards))
        assert out[("a", t)] == pytest.approx(expected, abs=tol)
        assert turns[("a", t)] == pytest.approx(expected, abs=tol)


@PROPS
@given(st.lists(grid_rewards, min_size=1, max_size=12))
def test_undiscounted_returns_are_suffix_sums_and_gamma_zero_the_rewards(rewards: list[float]) -> None:
    out = MonteCarloReturn(gamma=1.0).compute([rollout("a", rewards)])
    assert [out[("a", t)] for t in range(len(rewards))] == [sum(rewards[t:]) for t in range(len(rewards))]
    myopic = MonteCarloReturn(gamma=0.0).compute([rollout("a", rewards)])
    assert [myopic[("a", t)] for t in range(len(rewards))] == rewards


@pytest.mark.parametrize("gamma", [-0.1, 1.0001, math.nan, math.inf])
def test_gamma_outside_zero_one_is_refused(gamma: float) -> None:
    with pytest.raises(ValueError, match="gamma must be in"):
        MonteCarloReturn(gamma=gamma)
    with pytest.raises(ValueError, match="gamma must be in"):
        PerTurnReturn(gamma=gamma)
