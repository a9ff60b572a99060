"""Tic-Tac-Toe board logic and the built-in opponents, kept apart from the env protocol.

Cells are numbered 1-9, left to right, top to bottom; the board is a 9-char list of
"X", "O" or " ".
"""

from __future__ import annotations

import random

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
OPPONENTS = ("random", "heuristic")


def other(mark: str) -> str:
    return "O" if mark == "X" else "X"


def empty_cells(board: list[str]) -> list[int]:
    """Free cells, numbered 1-9."""
    return [i + 1 for i, c in enumerate(board) if c == " "]


def winner(board: list[str]) -> str | None:
    for a, b, c in LINES:
        if board[a] != " " and board[a] == board[b] == board[c]:
            return board[a]
    return None


def render(board: list[str]) -> str:
    """Rows like ``X|2|3``: free cells show their number so the model can name them."""
    cells = [c if c != " " else str(i + 1) for i, c in enumerate(board)]
    return "\n".join("|".join(cells[r * 3 : r * 3 + 3]) for r in range(3))


CELLS = "123456789"
SHOWN = 40
"""Characters of a refused reply quoted back in the reason (the reason becomes the next prompt)."""


def parse_cell(action: str, board: list[str]) -> tuple[int | None, str | None]:
    """(cell, None) for a legal move, else (None, reason).

    Only the ASCII digits 1-9 are cells: ``str.isdigit`` also passes "٠" (``int`` gives 0, i.e. cell 9
    through ``board[-1]``) and "²" (``int`` raises)."""
    text = action.strip()
    if len(text) != 1 or text not in CELLS:
        return None, f"{_quoted(text)} is not a cell number 1-9"
    cell = int(text)
    if board[cell - 1] != " ":
        return None, f"cell {cell} is already taken"
    return cell, None


def _quoted(text: str) -> str:
    """``text`` as a repr (control characters visible), cut to :data:`SHOWN` characters."""
    if len(text) <= SHOWN:
        return repr(text)
    return f"{text[:SHOWN]!r}... ({len(text)} characters)"


def _completing_move(board: list[str], mark: str) -> int | None:
    for a, b, c in LINES:
        line = [board[a], board[b], board[c]]
        if line.count(mark) == 2 and line.count(" ") == 1:
            return (a, b, c)[line.index(" ")] + 1
    return None


def bot_move(board: list[str], mark: str, kind: str, rng: random.Random) -> int:
    """The opponent's cell. "random": uniform; "heuristic": win, else block, else centre, else random."""
    free = empty_cells(board)
    if kind == "heuristic":
        for target in (mark, other(mark)):
            cell = _completing_move(board, target)
            if cell is not None:
                return cell
        if 5 in free:
            return 5
    return rng.choice(free)
