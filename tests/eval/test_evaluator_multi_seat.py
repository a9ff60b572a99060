"""The Evaluator on a real two-seat game through the real RolloutEngine: a failed episode is counted once
(not per seat, and not hidden because the surviving games return two rollouts each) and left out of every
average; a NaN or infinite reward raises, naming the rollout, instead of turning the mean into NaN."""

from __future__ import annotations

import json
import math
import re

import pytest

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import TicTacToeEnv
from ludic.eval import Evaluator
from ludic.interaction import MultiAgentProtocol
from ludic.parsers import ParseResult
from ludic.testing.scripted_client import ScriptedChatClient
from ludic.training.batching import RolloutEngine
from ludic.training.stats import Reducer
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest


class FlakyTicTacToe(TicTacToeEnv):
    """Two-seat Tic-Tac-Toe whose games with an odd seed crash on O's first move (X has already moved)."""

    def reset(self, seed=None):
        self.seed, self.moves = seed, 0
        return super().reset(seed)

    def step(self, actions):
        self.moves += 1
        if self.seed is not None and self.seed % 2 and self.moves == 2:
            raise RuntimeError(f"game with seed {self.seed} crashed")
        return super().step(actions)


def _agent(cells: list[str]) -> Agent:
    return Agent(
        client=ScriptedChatClient(cells), model="m", ctx=FullDialog(), parser=lambda t: ParseResult(action=t)
    )


def _self_play() -> MultiAgentProtocol:
    """X plays 1, 2, 3 and wins (1.0 on its last step); O plays 4, 5 and loses (0.0)."""
    return MultiAgentProtocol({"x": _agent(["1", "2", "3"]), "o": _agent(["4", "5"])})


def _evaluator(seeds: list[int], protocol=_self_play, **env_kwargs) -> Evaluator:
    engine = RolloutEngine(env_registry={"ttt": FlakyTicTacToe}, protocol_registry={"self_play": protocol})
    env = EnvSpec("ttt", {"two_player": True, **env_kwargs})
    requests = [RolloutRequest(env, ProtocolSpec("self_play"), env_seed=s) for s in seeds]
    reducers = {"mean_step_reward": Reducer(kind="mean", source="reward")}
    return Evaluator(engine=engine, requests=requests, max_steps=9, reducers=reducers)


async def test_failed_two_seat_games_are_counted_as_episodes_and_left_out_of_the_averages() -> None:
    ev = _evaluator([0, 1, 2, 3])  # games 1 and 3 crash; 0 and 2 return one rollout per seat
    stats = await ev.evaluate()
    # before: failed_rollouts = 4 requested - 4 rollouts returned = 0, the two crashed games hidden
    assert stats["eval/failed_rollouts"] == 2.0
    assert stats["eval/num_episodes"] == 4.0  # seat rollouts of the games that did not fail
    assert stats["eval/empty_rollouts"] == 0.0
    assert stats["eval/avg_total_reward"] == 0.5  # X's 1.0 and O's 0.0, twice; no failed 0.0 averaged in
    assert stats["eval/parse_error_rate"] == 0.0
    assert stats["eval/avg_completion_length"] == 1.0
    assert stats["eval/mean_step_reward"] == pytest.approx(2 / 10)  # 2 games x (3 + 2) steps, one win each
    assert sorted(r.meta["agent_id"] for r in ev.last_rollouts) == ["o", "o", "x", "x"]
    assert sorted(r.meta["engine"]["env_seed"] for r in ev.last_failed) == [1, 3]  # one rollout per game
    assert all(r.meta["error"]["message"].startswith("game with seed") for r in ev.last_failed)


async def test_failed_episodes_are_written_with_their_error_beside_the_others(tmp_path) -> None:
    """Before, eval_step_N.jsonl held only the episodes that did not fail: a crashed game left no line."""
    ev = _evaluator([0, 1, 2, 3])
    ev.out_dir = tmp_path
    await ev.evaluate(step=5)
    lines = [json.loads(x) for x in (tmp_path / "eval_step_5.jsonl").read_text().splitlines()]
    assert [x["failed"] for x in lines] == [False] * 4 + [True] * 2  # the seats that played, then the games
    crashed = lines[4:]
    assert sorted(x["env_seed"] for x in crashed) == [1, 3]
    assert all(x["error"]["message"] == f"game with seed {x['env_seed']} crashed" for x in crashed)
    assert all("error" not in x for x in lines[:4])
    summary = json.loads((tmp_path / "eval_step_5_summary.json").read_text())
    assert summary["eval/failed_rollouts"] == 2.0 and summary["eval/num_episodes"] == 4.0


async def test_a_failed_two_seat_game_counts_once_not_once_per_seat() -> None:
    ev = _evaluator([1, 2])
    stats = await ev.evaluate()
    assert (stats["eval/failed_rollouts"], stats["eval/num_episodes"]) == (1.0, 2.0)
    assert stats["eval/avg_total_reward"] == 0.5


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
async def test_a_non_finite_reward_raises_naming_the_rollout(bad: float) -> None:
    ev = _evaluator([0, 2], win_reward=bad)  # X's winning move is rewarded with ``bad``
    with pytest.raises(ValueError, match="non-finite reward") as raised:
        await ev.evaluate()
    (first_bad, *_) = [r for r in ev.last_rollouts if not math.isfinite(r.total_reward)]
    assert re.search(re.escape(repr(first_bad.id)), str(raised.value))
    assert (
        "agent 'x'" in str(raised.value)
        and "env_seed 0" in str(raised.value)
        and "step 2" in str(raised.value)
    )


async def test_a_total_that_overflows_raises_too() -> None:
    def x_repeats_a_cell() -> MultiAgentProtocol:  # X's second "1" is illegal (1e308), then it wins (1e308)
        return MultiAgentProtocol({"x": _agent(["1", "1", "2", "3"]), "o": _agent(["4", "5"])})

    ev = _evaluator([0], protocol=x_repeats_a_cell, win_reward=1e308, illegal_move_reward=1e308)
    with pytest.raises(ValueError, match="total reward is inf"):
        await ev.evaluate()
