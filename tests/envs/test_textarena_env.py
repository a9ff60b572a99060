"""TextArena games as multi-agent envs, with the real package on TicTacToe-v0: whole games through
Ludic's multi-agent kernel (vs a bot and in self-play), rewards per seat, bounded observations."""

from __future__ import annotations

import asyncio
import builtins
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("textarena")

from ludic.envs.textarena_env import RandomMoveBot, TextArenaEnv
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.registry import ENV_REGISTRY


class LegalMoveAgent:
    """A scripted agent: plays the first move the game lists as available (records what it saw)."""

    def __init__(self) -> None:
        self.ctx = SimpleNamespace(system_prompt=None)
        self.sampling = None
        self.seen: list[str] = []

    def reset(self, system_prompt: str | None = None) -> None:
        self.seen = []

    def on_env_reset(self, obs: str, info: dict) -> None:
        self.seen.append(obs)

    def on_after_step(self, obs: str, info: dict) -> None:
        self.seen.append(obs)

    async def act(self, sampling=None):
        move = _first_move(self.seen[-1])
        return ParseResult(action=move, reward=0.0, obs=None), {"raw_text": move}


def _first_move(obs: str) -> str:
    tail = obs.rsplit("Available Moves", 1)[-1]
    return tail.split("'")[1]


def _play(env: TextArenaEnv, agents: dict[str, LegalMoveAgent], seed: int = 0):
    return asyncio.run(MultiAgentProtocol(agents).run(env=env, max_steps=20, env_seed=seed))


def test_policy_against_the_random_bot_ends_with_the_games_rewards() -> None:
    agent = LegalMoveAgent()
    (rollout,) = _play(TextArenaEnv("TicTacToe-v0", observation="board"), {"player_0": agent}, seed=1)
    last = rollout.steps[-1]
    assert last.terminated and last.info["result"] in ("win", "loss", "draw")
    assert last.reward == {"win": 1.0, "loss": -1.0, "draw": 0.0}[last.info["result"]]
    assert last.info["invalid_move"] is False  # only legal moves were played
    assert sorted(last.info["game_rewards"]) == [0, 1]


def test_self_play_gives_each_seat_its_own_reward() -> None:
    agents = {"player_0": LegalMoveAgent(), "player_1": LegalMoveAgent()}
    r0, r1 = _play(TextArenaEnv("TicTacToe-v0", players=[0, 1]), agents)
    # first-listed moves: O takes 0, X 1, O 2, X 3, O 4, X 5, O 6 -> O wins on the 2-4-6 diagonal
    assert [s.info.get("parsed_action") for s in r0.steps] == ["[0]", "[2]", "[4]", "[6]"]
    assert (r0.steps[-1].reward, r1.steps[-1].reward) == (1.0, -1.0)
    assert (r0.steps[-1].info["result"], r1.steps[-1].info["result"]) == ("win", "loss")
    assert "X" in agents["player_0"].seen[1]  # seat 0 saw seat 1's move before its second turn


def test_observation_does_not_grow_unless_asked() -> None:
    lengths = {}
    for view in ("board", "first_last", "full"):
        agent = LegalMoveAgent()
        _play(
            TextArenaEnv("TicTacToe-v0", players=[0, 1], observation=view),
            {"player_0": agent, "player_1": LegalMoveAgent()},
        )
        lengths[view] = [len(o) for o in agent.seen]
    assert max(lengths["board"]) <= lengths["board"][0] + 20
    assert max(lengths["first_last"]) <= lengths["first_last"][0] + 20
    assert lengths["full"][-1] > 2 * lengths["full"][0]  # the whole history, only when asked


def test_policy_as_second_seat_through_the_single_agent_protocol() -> None:
    env = ENV_REGISTRY.build("textarena", game="TicTacToe-v0", players=[1], observation="board")
    (rollout,) = asyncio.run(SingleAgentProtocol(LegalMoveAgent()).run(env=env, max_steps=9, env_seed=2))
    assert rollout.steps[0].prev_obs.count("O") >= 2  # the bot (seat 0) moved before the policy's turn
    assert rollout.steps[-1].terminated and rollout.steps[-1].info["result"] in ("win", "loss", "draw")


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="observation must be"):
        TextArenaEnv("TicTacToe-v0", observation="history")
    with pytest.raises(ValueError, match=r"distinct seats in 0\.\.1"):
        TextArenaEnv("TicTacToe-v0", players=[2])
    with pytest.raises(ValueError, match="NoSuchGame-v0"):
        TextArenaEnv("NoSuchGame-v0")
    with pytest.raises(ValueError, match='no "Available Moves'):
        RandomMoveBot(0)("say something")


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_textarena(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("textarena"):
            raise ImportError("No module named 'textarena'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "textarena", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_textarena)
    with pytest.raises(ImportError, match=r"pip install 'ludic\[textarena\]'"):
        TextArenaEnv("TicTacToe-v0")


def test_demonstrations_are_listed_moves_in_the_games_format_seen_as_the_policy_sees() -> None:
    from ludic.envs.demonstrations import ProvidesDemonstrations

    env = TextArenaEnv("TicTacToe-v0", observation="board")
    assert isinstance(env, ProvidesDemonstrations)
    demos = env.demonstrations(12, seed=3)
    assert len(demos) == 12 and [d.answer for d in demos] == [
        d.answer for d in env.demonstrations(12, seed=3)
    ]
    for d in demos:
        listed = d.prompt.rsplit("Available Moves", 1)[1]
        assert d.answer in listed and len(d.answer) == 3 and d.answer[0] == "[" and d.answer[2] == "]"
        assert d.prompt.startswith("You are Player 0 in Tic Tac Toe.")  # seat 0's own view
    assert demos[0].prompt == env.reset(seed=5)["player_0"][0]  # a game's opening: exactly what play shows
    assert [d.answer for d in env.demonstrations(12, seed=4)] != [d.answer for d in demos]


def test_self_play_demonstrations_cover_both_seats() -> None:
    demos = TextArenaEnv("TicTacToe-v0", players=[0, 1], observation="board").demonstrations(9, seed=0)
    seats = {d.prompt.split("\n", 1)[0] for d in demos}
    assert seats == {"You are Player 0 in Tic Tac Toe.", "You are Player 1 in Tic Tac Toe."}


def test_board_only_view_is_the_latest_board_without_the_rules() -> None:
    env = TextArenaEnv("TicTacToe-v0", observation="board_only")
    first = env.reset(seed=2)["player_0"][0]
    assert first.startswith("Current Board:") and first.endswith("'[8]'") and "Tic Tac Toe" not in first
    later = env.step({"player_0": "[4]"})["player_0"].obs
    assert later.startswith("Current Board:") and "'[4]'" not in later and len(later) <= len(first)


def test_a_refused_move_that_may_be_retried_is_flagged_and_scored_only_when_asked() -> None:
    plain = TextArenaEnv("TicTacToe-v0", observation="board_only")
    plain.reset(seed=0)
    out = plain.step({"player_0": "nine"})["player_0"]
    assert (out.reward, out.terminated, out.info) == (0.0, False, {"invalid_move": True})
    shaped = TextArenaEnv("TicTacToe-v0", observation="board_only", invalid_move_reward=-1.0)
    shaped.reset(seed=0)
    assert shaped.step({"player_0": "nine"})["player_0"].reward == -1.0
    assert shaped.step({"player_0": "[4]"})["player_0"].reward == 0.0  # a legal move: no penalty
    assert shaped.step({"player_0": "[4]"})["player_0"].info == {"invalid_move": True}  # taken: refused
    last = shaped.step({"player_0": "[4]"})["player_0"]  # twice in a row: the game ends, its own -1
    assert last.terminated and last.reward == -1.0 and last.info["result"] == "loss"


def _lake(obs: str) -> list[list[str]]:
    """The FrozenLake grid from a board_only observation: rows of ' ', 'H', 'G', 'P'."""
    rows = [line for line in obs.splitlines() if line.startswith("|")]
    return [[cell.strip() or " " for cell in row.strip("|").split("|")] for row in rows]


def _path_to(grid: list[list[str]], target: str) -> list[str]:
    """Moves from P to the first cell holding ``target`` ('G' avoids holes; 'H' walks straight in)."""
    n = len(grid)
    start = next((r, c) for r in range(n) for c in range(n) if grid[r][c] == "P")
    moves = {"[up]": (-1, 0), "[down]": (1, 0), "[left]": (0, -1), "[right]": (0, 1)}
    frontier, seen = [(start, [])], {start}
    while frontier:
        (r, c), path = frontier.pop(0)
        for move, (dr, dc) in moves.items():
            nr, nc = r + dr, c + dc
            if not (0 <= nr < n and 0 <= nc < n) or (nr, nc) in seen:
                continue
            if grid[nr][nc] == target:
                return [*path, move]
            if grid[nr][nc] == " ":
                seen.add((nr, nc))
                frontier.append(((nr, nc), [*path, move]))
    raise AssertionError(f"no path to {target!r} in {grid}")


@pytest.mark.parametrize(("target", "result"), [("G", "win"), ("H", "loss")])
def test_single_player_game_is_won_only_by_solving_it(target: str, result: str) -> None:
    env = TextArenaEnv("FrozenLake-v0", num_players=1, observation="board_only")
    obs, _ = env.reset(seed=3)["player_0"]
    assert _lake(obs)[0][0] == "P" and _lake(obs)[3][3] == "G"
    moves = _path_to(_lake(obs), target)
    for move in moves[:-1]:
        assert env.step({"player_0": move})["player_0"].terminated is False
    last = env.step({"player_0": moves[-1]})["player_0"]
    # reaching the goal is the game's reward 1, a win; a hole ends it with partial credit (< 1), a loss
    assert last.terminated and last.info["result"] == result
    assert (last.reward == 1.0) == (result == "win") and 0.0 <= last.reward <= 1.0


def test_random_bot_and_demonstrations_read_an_available_actions_list() -> None:
    env = TextArenaEnv("FrozenLake-v0", num_players=1, observation="board_only")
    obs, _ = env.reset(seed=0)["player_0"]
    assert obs.endswith("Available Actions: [up], [down], [left], [right], [w], [a], [s], [d]")
    listed = {"[up]", "[down]", "[left]", "[right]", "[w]", "[a]", "[s]", "[d]"}
    assert {RandomMoveBot(seed=s)(obs) for s in range(40)} == listed
    demos = env.demonstrations(12, seed=0)
    assert len(demos) == 12 and {d.answer for d in demos} <= listed
    assert all(d.prompt.startswith("Current Board:") for d in demos)
