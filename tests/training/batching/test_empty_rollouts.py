"""A self-play seat that never moved (the real TextArena game ended first) has an empty rollout: the rollout
engine labels it, counts it and never trains on it, and its seat's group leaves the batch; the evaluator
counts it apart instead of averaging it in as a reward of 0."""

from __future__ import annotations

import pytest

pytest.importorskip("textarena")

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs.textarena_env import TextArenaEnv
from ludic.eval import Evaluator
from ludic.interaction import MultiAgentProtocol
from ludic.parsers import ParseResult
from ludic.testing.scripted_client import ScriptedChatClient
from ludic.training.batching import GRPORequestStrategy, RolloutEngine
from ludic.training.credit.assigners import GroupNormalizedReturn
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest


def _first_listed_move(request) -> str:
    """Plays the first move the game lists (TicTacToe lists them as "'[4]', '[5]'")."""
    text = request.messages[-1]["content"]
    return text.rsplit("Available Moves", 1)[-1].split("'")[1]


def _agent(reply) -> Agent:
    client = ScriptedChatClient(reply)
    return Agent(client=client, model="m", ctx=FullDialog(), parser=lambda t: ParseResult(action=t))


def _self_play(opening: str) -> MultiAgentProtocol:
    """Seat 0 plays ``opening`` ("refuse": an unparseable move every turn, so TextArena ends the game
    on its second refusal, before seat 1 moves; "legal": the first listed move); seat 1 plays legally."""
    first = (lambda request: "nine") if opening == "refuse" else _first_listed_move
    return MultiAgentProtocol({"player_0": _agent(first), "player_1": _agent(_first_listed_move)})


class _Algo:
    def __init__(self) -> None:
        self.credit_assigner = GroupNormalizedReturn(group_size=2)
        self.preprocess = None
        self.name = "test"


async def test_a_seat_that_never_moved_is_counted_and_its_group_never_trained() -> None:
    engine = RolloutEngine(
        env_registry={"textarena": TextArenaEnv},
        protocol_registry={"self_play": _self_play},
    )
    env = EnvSpec("textarena", {"game": "TicTacToe-v0", "players": [0, 1], "observation": "board"})
    legal = ProtocolSpec("self_play", {"opening": "legal"})
    grouped = GRPORequestStrategy(group_size=2).expand(
        [RolloutRequest(env, legal, env_seed=s) for s in (0, 1)]
    )
    mixed_gid, legal_gid = grouped[0].meta["group_id"], grouped[2].meta["group_id"]
    refused = RolloutRequest(env, ProtocolSpec("self_play", {"opening": "refuse"}), meta=grouped[0].meta)
    requests = [refused, *grouped[1:]]  # group "mixed": one game seat 1 never moved in, one it played

    rollouts = await engine.generate_rollouts(requests=requests, max_steps=10)
    (empty,) = [r for r in rollouts if not r.steps]
    assert (empty.meta["agent_id"], empty.meta["empty"]) == ("player_1", True)
    assert empty.meta["unassigned_reward"] == 1.0  # seat 1 won without moving: not a reward to train on

    batch = await engine.generate_batch(requests, _Algo(), max_steps=10)
    assert batch.meta["empty_rollouts"] == 1 and batch.meta["failed_rollouts"] == 0
    trained = {(it.meta["group_id"], it.meta["agent_id"]) for it in batch.items}
    assert trained == {(mixed_gid, "player_0"), (legal_gid, "player_0"), (legal_gid, "player_1")}
    assert batch.meta["dropped_group_rollouts"] == 1  # seat 1's other game in the mixed group


async def test_the_evaluator_counts_a_seat_that_never_moved_apart_from_the_rewards() -> None:
    engine = RolloutEngine(env_registry={"textarena": TextArenaEnv}, protocol_registry={"self_play": _self_play})
    env = EnvSpec("textarena", {"game": "TicTacToe-v0", "players": [0, 1], "observation": "board"})
    refused = RolloutRequest(env, ProtocolSpec("self_play", {"opening": "refuse"}), env_seed=0)
    stats = await Evaluator(engine=engine, requests=[refused], max_steps=10).evaluate()
    (played,) = [r for r in (await engine.generate_rollouts(requests=[refused], max_steps=10)) if r.steps]
    assert stats["eval/num_episodes"] == 2 and stats["eval/empty_rollouts"] == 1
    assert stats["eval/avg_total_reward"] == pytest.approx(played.total_reward)  # seat 0's alone
    assert played.total_reward < 0  # seat 0 lost on its refusals; averaging seat 1's empty 0 in would halve it
