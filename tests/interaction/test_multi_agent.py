import pytest

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import LudicEnv, TicTacToeEnv
from ludic.interaction import MultiAgentProtocol, TraceCollector
from ludic.interaction.multi_agent import REPLAY_OBS
from ludic.parsers import xml_tag_parser
from ludic.testing.scripted_client import ScriptedChatClient
from ludic.types import Step, StepOutcome


def _agent(replies, tag="move"):
    client = ScriptedChatClient(replies)
    return Agent(client=client, model="m", ctx=FullDialog(), parser=xml_tag_parser(tag)), client


def _moves(*cells):
    return [f"<move>{c}</move>" for c in cells]


async def test_two_agents_get_their_own_rollouts_and_the_loser_is_credited():
    x, _ = _agent(_moves(1, 2, 3))
    o, o_client = _agent(_moves(4, 5))
    rx, ro = await MultiAgentProtocol({"x": x, "o": o}).run(env=TicTacToeEnv(two_player=True), max_steps=9)
    assert (rx.meta["agent_id"], ro.meta["agent_id"]) == ("x", "o")
    assert [s.info["parsed_action"] for s in rx.steps] == ["1", "2", "3"]
    assert [s.info["parsed_action"] for s in ro.steps] == ["4", "5"]
    assert [s.reward for s in rx.steps] == [0.0, 0.0, 1.0]
    assert [s.reward for s in ro.steps] == [0.0, 0.0]
    assert rx.steps[-1].info["result"] == "win" and ro.steps[-1].info["result"] == "loss"
    assert ro.steps[-1].terminated and ro.steps[-1].next_obs is None
    assert ro.steps[-1].info["move"] == 5  # the off-turn outcome does not overwrite the agent's own info
    assert (
        ro.steps[0].prev_obs
        == "You are O. Board:\nX|2|3\n4|5|6\n7|8|9\nYour move: reply with the number of a free cell."
    )
    assert (
        ro.steps[0].next_obs
        == "You are O. Board:\nX|X|3\nO|5|6\n7|8|9\nYour move: reply with the number of a free cell."
    )
    assert ro.steps[1].prev_obs == ro.steps[0].next_obs
    # o saw its "waiting" reset obs, then the board after x's move, before its first reply
    assert [m["role"] for m in o_client.requests[0].messages] == ["system", "user", "user"]
    assert rx.meta["episode_truncated"] is False and ro.meta["truncation_reason"] is None


async def test_unmanaged_seat_is_played_by_the_env():
    x, _ = _agent(_moves(1, 9, 3))
    (rx,) = await MultiAgentProtocol({"x": x}).run(
        env=TicTacToeEnv(two_player=True, opponent="heuristic"), max_steps=20, env_seed=0
    )
    assert rx.steps[0].next_obs.startswith("Opponent (O) played 5.\nYou are X.")
    assert rx.meta["agent_id"] == "x"


class SimultaneousEnv(LudicEnv):
    """Both agents say a number each turn; reward = own number; ends after one applied turn."""

    def __init__(self):
        self.calls = []

    @property
    def agent_ids(self):
        return ["a", "b"]

    @property
    def active_agents(self):
        return [] if self.calls else ["a", "b"]

    def reset(self, seed=None):
        return {"a": ("go a", {}), "b": ("go b", {})}

    def step(self, actions):
        self.calls.append(dict(actions))
        return {k: StepOutcome("end", float(v), False, True, {}) for k, v in actions.items()}


async def test_one_parse_failure_means_env_step_is_not_called_that_turn():
    a, a_client = _agent(["oops", "<n>1</n>"], tag="n")
    b, b_client = _agent(["<n>2</n>", "<n>3</n>"], tag="n")
    env = SimultaneousEnv()
    ra, rb = await MultiAgentProtocol({"a": a, "b": b}).run(env=env, max_steps=5, sampling_seed=2)
    assert env.calls == [{"a": "1", "b": "3"}]
    assert ra.steps[0].info["parse_error"] is True and ra.steps[0].reward == -1.0
    assert ra.steps[0].next_obs.startswith("Invalid format. Expected <n>")
    assert rb.steps[0].info["parse_error"] is False and rb.steps[0].info["turn_replayed"] is True
    assert rb.steps[0].next_obs == REPLAY_OBS
    assert [s.reward for s in ra.steps] == [-1.0, 1.0]
    assert [s.reward for s in rb.steps] == [0.0, 3.0]
    assert b_client.requests[1].messages[-1] == {"role": "user", "content": REPLAY_OBS}
    # seeds: sampling_seed * 1000 + turn * n_agents + agent position
    assert [r.sampling.seed for r in a_client.requests] == [2000, 2002]
    assert [r.sampling.seed for r in b_client.requests] == [2001, 2003]


async def test_max_steps_truncates_every_agents_last_step():
    x, _ = _agent(_moves(1, 2))
    o, _ = _agent(_moves(4, 5))
    rx, ro = await MultiAgentProtocol({"x": x, "o": o}).run(env=TicTacToeEnv(two_player=True), max_steps=2)
    for r in (rx, ro):
        assert r.steps[-1].truncated and r.steps[-1].next_obs is None
        assert r.steps[-1].info["truncation_reason"] == "max_steps"
        assert r.meta["episode_truncated"] is True


async def test_agents_must_exist_in_the_env():
    x, _ = _agent([])
    with pytest.raises(ValueError, match=r"agents \['z'\] are not in TicTacToeEnv.agent_ids"):
        await MultiAgentProtocol({"z": x}).run(env=TicTacToeEnv(two_player=True), max_steps=1)


def _step(i, reward=0.0):
    return Step(i, "p", "a", "n", reward, False, False, {"k": 1})


def test_trace_collector_credits_the_latest_step_and_keeps_rollouts_apart():
    c = TraceCollector(["a", "b"])
    c.credit_latest("b", reward=2.0)  # before b's first step
    c.record("a", _step(0))
    c.record("a", _step(1))
    c.credit_latest("a", reward=0.5, next_obs="x", terminated=True, info={"k": 9, "result": "loss"})
    ra, rb = c.rollouts(meta={"episode": 1})
    assert ra.steps[1].reward == 0.5 and ra.steps[1].terminated and ra.steps[1].next_obs is None
    assert ra.steps[1].info == {"k": 1, "result": "loss"}
    assert ra.meta == {"episode": 1, "agent_id": "a"}
    assert rb.steps == [] and rb.meta["unassigned_reward"] == 2.0


def test_trace_collector_rejects_out_of_order_steps_and_unknown_agents():
    c = TraceCollector(["a"])
    with pytest.raises(ValueError, match=r"step\.index is 1, expected 0"):
        c.record("a", _step(1))
    with pytest.raises(KeyError, match="unknown agent id 'q'"):
        c.record("q", _step(0))
