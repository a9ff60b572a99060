"""A misbehaving env, parser or reply fails only its own episode, named; the rest of the batch trains."""

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.testing.scripted_client import ScriptedChatClient
from ludic.training.batching import RolloutEngine
from ludic.training.credit.assigners import GroupNormalizedReturn
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest
from ludic.types import StepOutcome

GOOD = {"obs": "next", "reward": 1.0, "terminated": True, "truncated": False, "info": {}}


class BadEnv(SingleAgentEnv):
    """One step; the outcome's fields are overridden by ``bad`` (a misbehaving env or reward function)."""

    def __init__(self, bad: dict | None = None, reset_obs: object = "go") -> None:
        self.bad, self.reset_obs = bad or {}, reset_obs

    def env_reset(self, *, seed=None):
        return self.reset_obs, {}

    def env_step(self, action: str) -> StepOutcome:
        f = {**GOOD, **self.bad}
        return StepOutcome(f["obs"], f["reward"], f["truncated"], f["terminated"], f["info"])

    def env_current_obs(self):
        return "go"


class _Algo:
    credit_assigner = GroupNormalizedReturn(group_size=2)
    preprocess = None
    name = "test"


def _engine(reply=lambda r: "a", parser=None, **kwargs) -> RolloutEngine:
    client = ScriptedChatClient(reply)
    parse = parser or (lambda text: ParseResult(action=text))

    def protocol():
        return SingleAgentProtocol(agent=Agent(client=client, model="m", ctx=FullDialog(), parser=parse))

    return RolloutEngine(env_registry={"e": BadEnv}, protocol_registry={"p": protocol}, **kwargs)


def _requests(bad_env_kwargs: dict) -> list[RolloutRequest]:
    """Group g1: two good episodes; group g2: one bad episode and one good one."""
    def req(kwargs, n, group):
        return RolloutRequest(EnvSpec("e", kwargs), ProtocolSpec("p"), num_episodes=n, meta={"group_id": group})

    rewards = {"bad": {"reward": 0.0}}  # g1's two rewards differ so its items carry credit
    return [req({}, 1, "g1"), req(rewards, 1, "g1"), req(bad_env_kwargs, 1, "g2"), req({}, 1, "g2")]


async def _assert_only_the_bad_group_fails(engine: RolloutEngine, bad_env_kwargs: dict, error: str) -> None:
    """In ``generate_batch``: only the bad group leaves; the failure is recorded with ``error`` in it."""
    batch = await engine.generate_batch(_requests(bad_env_kwargs), _Algo(), max_steps=2)
    assert batch.meta["failed_rollouts"] == 1.0
    assert {it.meta["group_id"] for it in batch.items} == {"g1"} and len(batch.items) == 2
    assert all(math.isfinite(it.weight) for it in batch.items)
    rollouts = await engine.generate_rollouts(
        requests=_requests(bad_env_kwargs), max_steps=2, include_failed=True, for_training=True
    )
    (failed,) = [r for r in rollouts if r.meta.get("failed")]
    assert error in failed.meta["error"]["message"], failed.meta["error"]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"reward": "1.5"}, "reward must be a real number, got str"),
        ({"reward": None}, "reward must be a real number, got NoneType"),
        ({"terminated": "False"}, "terminated must be a bool, got str"),
        ({"truncated": None}, "truncated must be a bool, got NoneType"),
        ({"obs": None, "terminated": False}, "observation must be a str"),
        ({"obs": b"bytes", "terminated": False}, "observation must be a str"),
        ({"obs": {"board": 1}, "terminated": False}, "observation must be a str"),
        ({"info": None}, "info must be a dict"),
    ],
)
async def test_a_malformed_env_outcome_fails_only_its_episode_named(bad: dict, error: str) -> None:
    await _assert_only_the_bad_group_fails(_engine(), {"bad": bad}, error)


@pytest.mark.parametrize("reset_obs", [None, b"go", {"a": 1}, 3])
async def test_a_reset_observation_that_is_not_text_fails_only_its_episode(reset_obs: object) -> None:
    await _assert_only_the_bad_group_fails(_engine(), {"reset_obs": reset_obs}, "observation must be a str")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=st.sampled_from([math.nan, math.inf, -math.inf, np.float64("nan"), np.float32("inf")]))
async def test_a_non_finite_env_reward_fails_only_its_episode_in_training(bad: float) -> None:
    await _assert_only_the_bad_group_fails(_engine(), {"bad": {"reward": bad}}, "non-finite reward")


async def test_finite_rewards_whose_total_overflows_fail_only_their_episode() -> None:
    bad = {"bad": {"reward": 1e308, "terminated": False}}
    await _assert_only_the_bad_group_fails(_engine(), bad, "total: non-finite reward")


@settings(max_examples=30, deadline=None)
@given(
    reward=st.one_of(st.booleans(), st.integers(-10, 10), st.floats(-1e6, 1e6)).map(
        lambda v: v if isinstance(v, bool) else np.float32(v) if isinstance(v, float) else np.int64(v)
    ),
    flag=st.sampled_from([True, np.True_]),
)
async def test_real_rewards_and_numpy_flags_train_as_plain_python_values(reward, flag) -> None:
    engine = _engine()
    req = RolloutRequest(EnvSpec("e", {"bad": {"reward": reward, "terminated": flag}}), ProtocolSpec("p"))
    (rollout,) = await engine.generate_rollouts(requests=[req], max_steps=2)
    step = rollout.steps[0]
    assert type(step.reward) is float and step.reward == float(reward)
    assert step.terminated is True and len(rollout.steps) == 1


@pytest.mark.parametrize("reward", [None, "0.5"])
async def test_a_parser_reward_that_is_not_a_number_fails_only_its_episode(reward) -> None:
    def parser(text: str) -> ParseResult:
        return ParseResult(action=None, reward=reward, obs="again") if text == "?" else ParseResult(text)

    calls = iter(range(100))
    engine = _engine(reply=lambda r: "?" if next(calls) == 2 else "a", parser=parser, max_failure_frac=0.9)
    batch = await engine.generate_batch(_requests({}), _Algo(), max_steps=2, concurrency=1)
    assert batch.meta["failed_rollouts"] == 1.0 and {it.meta["group_id"] for it in batch.items} == {"g1"}


async def test_an_empty_reply_fails_only_its_episode_not_the_batch() -> None:
    calls = iter(range(100))
    engine = _engine(reply=lambda r: "" if next(calls) == 2 else "a")
    batch = await engine.generate_batch(_requests({}), _Algo(), max_steps=2, concurrency=1)
    assert batch.meta["failed_rollouts"] == 1.0
    assert {it.meta["group_id"] for it in batch.items} == {"g1"} and len(batch.items) == 2


async def test_an_info_that_cannot_be_written_as_json_loses_nothing_else(tmp_path) -> None:
    circular: dict = {}
    circular["self"] = circular
    engine = _engine(jsonl_path=tmp_path / "r.jsonl")
    info = {"bad": {"info": {"loop": circular, "hit": True, "tags": {1, 2}, "obj": object()}}}
    batch = await engine.generate_batch(_requests(info), _Algo(), max_steps=2)
    assert batch.meta["failed_rollouts"] == 0.0 and len(batch.items) == 4
    assert sum(it.meta.get("hit") is True for it in batch.items) == 1
    records = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(records) == 4
    (bad,) = [r for r in records if r["meta"].get("info_unwritable")]
    assert "Circular reference" in bad["steps"][0]["info"]["info_unwritable"]


async def test_multi_agent_env_that_forgets_an_acting_agent_fails_named() -> None:
    from ludic.envs.tic_tac_toe import TicTacToeEnv

    class Forgetful(TicTacToeEnv):
        def step(self, actions):
            return {aid: out for aid, out in super().step(actions).items() if aid not in actions}

    agents = {aid: Agent(client=ScriptedChatClient(["<move>1</move>"] * 9), model="m", ctx=FullDialog(),
                         parser=lambda t: ParseResult(action=t)) for aid in ("x", "o")}  # fmt: skip
    env = Forgetful()
    protocol = MultiAgentProtocol(dict(zip(env.agent_ids, agents.values())))
    with pytest.raises(KeyError, match="no outcome for acting agents"):
        await protocol.run(env=env, max_steps=3)
