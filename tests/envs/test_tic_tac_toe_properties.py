"""Tic-Tac-Toe moves as the model writes them: any text is a legal cell 1-9 or an illegal move with a reason.

Invariants (``parse_cell``, ``TicTacToeEnv.step``): a reply is accepted only when it is, stripped, one of the
digits 1-9 naming a free cell, and the env then places exactly that mark there; anything else (other digits,
huge text, control characters, surrogates) never raises, leaves the board as it was, costs the illegal-move
reward and says why in an observation of bounded length.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.envs import TicTacToeEnv
from ludic.envs.tic_tac_toe_board import other, parse_cell

FAST = settings()  # the suite's profile (tests/conftest.py): 200 examples, 500 under CI=true

_boards = st.lists(st.sampled_from("XO "), min_size=9, max_size=9)
_moves = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["٠", "١", "²", "①", "５", "0", "10", "-1", "+5", "5.0", "05", "\t7\n", "\x00", "\ud800"]
    ),
    st.integers(-20, 20).map(str),
    st.integers(1, 9).map(lambda c: f" {c} "),
)


@FAST
@given(_moves, _boards)
def test_parse_cell_accepts_only_an_ascii_digit_naming_a_free_cell(move: str, board: list[str]) -> None:
    cell, reason = parse_cell(move, board)
    legal = move.strip() in list("123456789") and board[int(move.strip()) - 1] == " "
    if legal:
        assert (cell, reason) == (int(move.strip()), None)
    else:
        assert cell is None and isinstance(reason, str) and reason


@pytest.mark.parametrize("move", ["٠", "²", "①", "５"])
def test_other_unicode_digits_are_illegal_moves_not_cells_or_crashes(move: str) -> None:
    env = TicTacToeEnv()
    env.reset(seed=0)
    out = env.step({"agent_0": move})["agent_0"]  # "٠" was cell 0 (board[-1], cell 9); "²" a ValueError
    assert (out.reward, out.info["illegal_move"], env.board) == (-1.0, True, [" "] * 9)
    assert out.obs.startswith(f"Illegal move: {move!r} is not a cell number 1-9")


@FAST
@given(st.lists(_moves | st.integers(1, 9).map(str), min_size=1, max_size=8), st.booleans())
def test_any_replies_change_the_board_only_by_the_legal_moves_they_name(
    moves: list[str], two_player: bool
) -> None:
    env = TicTacToeEnv(two_player=two_player, opponent="random")
    env.reset(seed=0)
    for move in moves:
        if env.done:
            break
        (mover,) = env.active_agents
        before, mark = list(env.board), env.to_move
        out = env.step({mover: move})[mover]
        if out.info["illegal_move"]:
            assert env.board == before and out.reward == -1.0 and not out.terminated
            assert len(out.obs) < 300  # the reason quotes the reply, cut short
        else:
            cell = int(move.strip())
            assert before[cell - 1] == " " and env.board[cell - 1] == mark and out.info["move"] == cell
            placed = {i: env.board[i] for i in range(9) if before[i] != env.board[i]}
            assert placed.pop(cell - 1) == mark and all(before[i] == " " for i in placed)
            bot_moves = 0 if two_player else 1 if not env.done else len(placed)  # the bot answers a live game
            assert list(placed.values()) == [other(mark)] * bot_moves


def test_a_huge_reply_is_quoted_short_in_the_illegal_move_reason() -> None:
    env = TicTacToeEnv()
    env.reset(seed=0)
    out = env.step({"agent_0": "5" * 200_000})["agent_0"]
    assert out.info["illegal_move"] and len(out.obs) < 300  # was the whole reply, fed back as the next prompt
    assert out.obs.startswith("Illegal move: '5555") and "... (200000 characters)" in out.obs
