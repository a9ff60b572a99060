"""TextArena envs on any model text: listed moves come from the game's last list, and a reply never breaks
the env except as an error naming the game, the seat and (cut short) the move.

Invariants: ``listed_moves`` returns the ``[...]`` entries of the last "Available Moves:" / "Valid moves:" /
"available actions are:" line, in order, each a piece of that line with no bracket inside, in time linear
in the observation (text a model wrote earlier in the observation cannot replace the game's own final list);
``RandomMoveBot`` plays one of them or names what is missing; ``TextArenaEnv.step`` on any reply returns
an outcome per policy seat, the mover's flagged ``invalid_move`` when the game refused it.
"""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.envs.textarena_games import RandomMoveBot, listed_moves

FAST = settings()  # the suite's profile (tests/conftest.py): 200 examples, 500 under CI=true

_pieces = st.sampled_from(
    [
        "Available Moves:",
        "Valid moves are:",
        "available actions are:",
        "[",
        "]",
        "[4]",
        "[up]",
        " ",
        "\n",
        "'",
        ",",
    ]
)
_observations = st.lists(_pieces | st.text(max_size=4), max_size=14).map("".join) | st.text(max_size=80)
_moves = st.lists(st.text(st.characters(blacklist_characters="[]\n"), min_size=1, max_size=5), max_size=5)


@FAST
@given(_observations)
def test_listed_moves_are_bracketed_pieces_of_the_last_listed_line(obs: str) -> None:
    moves = listed_moves(obs)
    headers = list(re.finditer(r"(?:Available|Valid|Legal) (?:Moves|Actions)(?: are)?:", obs, re.IGNORECASE))
    if not headers:
        assert moves == []
        return
    line_start = obs.rfind("\n", 0, headers[-1].start()) + 1
    # a line's first header starts its list (its match runs to the end of the line)
    first_on_line = next(h for h in headers if h.start() >= line_start)
    line = obs[first_on_line.end() :].split("\n", 1)[0]
    at = 0
    for move in moves:
        assert move[0] == "[" and move[-1] == "]" and len(move) > 2 and not set(move[1:-1]) & set("[]\n")
        at = line.index(move, at) + len(move)  # in order, each after the one before
    assert moves == re.findall(r"\[[^\[\]]+\]", line)


@FAST
@given(_observations, _moves, st.sampled_from(["Available Moves:", "Valid moves:", "available actions are:"]))
def test_the_games_final_list_wins_over_anything_written_before_it(
    prefix: str, moves: list[str], header: str
) -> None:
    obs = f"{prefix}\n{header} " + ", ".join(f"[{m}]" for m in moves)
    assert listed_moves(obs) == [f"[{m}]" for m in moves]
    if moves:
        assert RandomMoveBot(seed=0)(obs) in listed_moves(obs)
    else:
        with pytest.raises(ValueError, match='found no "Available Moves'):
            RandomMoveBot(seed=0)(obs)


@pytest.mark.parametrize(
    "obs",
    [
        "Available Moves:" * 200_000,
        "Available Moves: " + "[" * 2_000_000,
        "Valid moves: " + "[a" * 1_000_000,
        "Available Moves: [" + "x" * 2_000_000,
        "available actions are " * 200_000,
        "Available Moves: [1]\n" * 200_000,
    ],
)
def test_listed_moves_is_linear_on_megabyte_observations(obs: str) -> None:
    started = time.perf_counter()
    moves = listed_moves(obs)
    # linear: well under 0.2 s here; backtracking would take minutes
    assert time.perf_counter() - started < 5.0
    assert moves == (["[1]"] if obs.endswith("[1]\n") else [])


_replies = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "\ud800", "[4]", "[ 4 ]", "[4][5]", "[-1]", "[4.0]", "[٤]", "[²]", "[0x4]"]),
    st.integers(-3, 12).map(lambda c: f"[{c}]"),
    st.integers(10, 5000).map(lambda n: "[" * n),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_replies, min_size=1, max_size=4))
def test_any_reply_is_a_move_or_a_refused_move_in_tic_tac_toe(replies: list[str]) -> None:
    env = _tic_tac_toe()
    env.reset(seed=0)
    for reply in replies:
        if not env.active_agents:
            break
        (mover,) = env.active_agents
        out = env.step({mover: reply})
        assert set(out) == set(env.agent_ids)
        if out[mover].terminated:
            assert out[mover].info["result"] in ("win", "loss", "draw")
        else:
            assert isinstance(out[mover].obs, str) and out[mover].info in ({}, {"invalid_move": True})


def test_a_move_the_game_crashes_on_is_an_error_naming_the_game_and_the_move_cut_short() -> None:
    env = _tic_tac_toe()
    env.reset(seed=0)
    crash = r"TicTacToe-v0 raised on player_0's move '\[9{78}: ValueError"  # the move's repr cut to 80
    with pytest.raises(RuntimeError, match=crash) as err:
        env.step({"player_0": "[" + "9" * 5000 + "]"})  # TextArena's int() refuses over 4300 digits
    assert len(str(err.value)) < 400


_ENV = []


def _tic_tac_toe():
    """One env for the module (building it plays a trial game)."""
    pytest.importorskip("textarena")
    from ludic.envs.textarena_env import TextArenaEnv

    if not _ENV:
        _ENV.append(TextArenaEnv("TicTacToe-v0", observation="board"))
    return _ENV[0]
