"""GRPO groups are formed in one place, from the algorithm's group size."""

from __future__ import annotations

import pytest

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.testing.scripted_client import ScriptedChatClient
from ludic.training.batching import (
    GRPORequestStrategy,
    IdentityRequestStrategy,
    RolloutBatchSource,
    RolloutEngine,
)
from ludic.training.presets import make_grpo, make_sft
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest
from ludic.types import StepOutcome


class SayA(SingleAgentEnv):
    def env_reset(self, *, seed=None):
        return "say a", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(None, float(action == "a"), False, True, {})

    def env_current_obs(self):
        return "say a"


def _source(algorithm, replies=("a", "b"), **kw) -> RolloutBatchSource:
    client = ScriptedChatClient(lambda req: replies[(req.sampling.seed or 0) % len(replies)])

    def protocol():
        return SingleAgentProtocol(
            agent=Agent(client=client, model="m", ctx=FullDialog(), parser=ParseResult)
        )

    engine = RolloutEngine(env_registry={"say": SayA}, protocol_registry={"one": protocol})
    prompts = kw.pop(
        "prompts", lambda: [RolloutRequest(EnvSpec("say"), ProtocolSpec("one"), env_seed=i) for i in (1, 2)]
    )
    return RolloutBatchSource(engine=engine, request_fn=prompts, algorithm=algorithm, max_steps=1, **kw)


async def test_group_algorithm_forms_groups_of_its_own_size_without_a_strategy() -> None:
    batch = await _source(make_grpo(group_size=3)).next_batch()
    groups = [it.meta["request_meta"]["group_id"] for it in batch.items]
    assert len(batch.items) == 6 and sorted(groups.count(g) for g in set(groups)) == [3, 3]


async def test_non_group_algorithm_plays_requests_as_given() -> None:
    batch = await _source(make_sft()).next_batch()
    assert len(batch.items) == 2


def test_strategy_and_algorithm_disagreeing_on_group_size_is_an_error() -> None:
    with pytest.raises(
        ValueError,
        match=r"GRPORequestStrategy\(group_size=4\) but the algorithm 'grpo' normalises groups of 8",
    ):
        _source(make_grpo(group_size=8), request_strategy=GRPORequestStrategy(group_size=4))


async def test_requests_grouped_by_hand_are_refused_unless_identity_strategy() -> None:
    grouped = GRPORequestStrategy(group_size=2).expand(
        [RolloutRequest(EnvSpec("say"), ProtocolSpec("one"), env_seed=1)]
    )
    with pytest.raises(ValueError, match="already carry meta\\['group_id'\\]"):
        await _source(make_grpo(group_size=2), prompts=lambda: grouped).next_batch()
    source = _source(
        make_grpo(group_size=2), prompts=lambda: grouped, request_strategy=IdentityRequestStrategy()
    )
    assert len((await source.next_batch()).items) == 2
