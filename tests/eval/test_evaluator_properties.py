"""Property-based tests of the Evaluator's summary: every average equals a direct float64 computation over the
episodes the engine returned, each episode counted once; a seat that never moved (``meta["empty"]``) is
counted apart and never averaged in as a reward of 0; failed episodes (``meta["failed"]``) are counted as
failed and left out of every average."""

from __future__ import annotations

import asyncio
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.eval import Evaluator
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest
from ludic.types import Rollout, Step, TokenTrace

PROPS = settings()  # the suite's profile (tests/conftest.py): 200 examples, 500 under CI=true
rewards = st.floats(-1e3, 1e3, allow_nan=False)


class FixedEngine:
    """Returns the given rollouts, dropping the failed ones unless ``include_failed``, as a RolloutEngine does."""

    def __init__(self, rollouts: list[Rollout]) -> None:
        self.rollouts = rollouts

    async def generate_rollouts(self, *, requests, max_steps, concurrency, include_failed=False):
        return [r for r in self.rollouts if include_failed or not r.meta.get("failed")]


@st.composite
def episodes(draw: st.DrawFn) -> Rollout:
    """A played episode of 1-4 steps (each with a reward, a parse-error flag and a completion length), or
    an empty seat."""
    if draw(st.booleans()) and draw(st.booleans()):
        return Rollout(steps=[], meta={"empty": True})
    steps = [
        Step(i, "o", "a", None, draw(rewards), False, False, info={"parse_error": draw(st.booleans())},
             trace=TokenTrace(prompt_token_ids=[1], completion_token_ids=[7] * draw(st.integers(0, 9))))
        for i in range(draw(st.integers(1, 4)))
    ]  # fmt: skip
    return Rollout(steps=steps)


def failed_episode() -> Rollout:
    """A failed episode as the engine records it: one stepless rollout, whatever its number of seats."""
    return Rollout(steps=[], meta={"failed": True, "error": {"type": "RuntimeError", "message": "boom"}})


def summarise(rollouts: list[Rollout], n_requests: int) -> dict[str, float]:
    requests = [RolloutRequest(EnvSpec("e"), ProtocolSpec("p"), env_seed=i) for i in range(n_requests)]
    ev = Evaluator(engine=FixedEngine(rollouts), requests=requests, max_steps=4)
    return asyncio.run(ev.evaluate())


def mean(xs: list[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else math.nan


@PROPS
@given(st.lists(episodes(), min_size=1, max_size=12), st.integers(0, 4))
def test_the_summary_equals_a_direct_computation_over_each_episode_once(
    played: list[Rollout], lost: int
) -> None:
    stats = summarise(played + [failed_episode() for _ in range(lost)], n_requests=len(played) + lost)
    non_empty = [r for r in played if r.steps]
    steps = [s for r in played for s in r.steps]
    expected = {
        "eval/num_episodes": float(len(played)),
        "eval/failed_rollouts": float(lost),
        "eval/empty_rollouts": float(len(played) - len(non_empty)),
        "eval/avg_total_reward": mean([math.fsum(s.reward for s in r.steps) for r in non_empty]),
        "eval/parse_error_rate": mean([float(s.info["parse_error"]) for s in steps]),
        "eval/avg_completion_length": mean([float(len(s.trace.completion_token_ids)) for s in steps]),
    }
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, rel=1e-9, abs=1e-9, nan_ok=True), key
