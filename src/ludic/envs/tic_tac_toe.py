"""Tic-Tac-Toe as a LudicEnv: one agent against a built-in opponent, or two agents.

Modes:
- vs bot (default): agent id ``"agent_0"``; the env plays the other mark with a seeded
  ``opponent`` ("random" or "heuristic") right after each legal agent move. With
  ``agent_starts=False`` the bot opens during ``reset``.
- two players (``two_player=True``): agent ids ``"x"`` (moves first) and ``"o"``. An active
  player whose action is missing from ``step(actions)`` is played by the built-in
  opponent, so a protocol may manage only one seat.

Actions are cell numbers 1-9. Rewards (per step, for the player concerned): win 1.0,
draw 0.5, loss 0.0, other legal moves 0.0; an illegal move costs -1.0, leaves the board
unchanged, and the same player moves again (obs says why). ``info["result"]`` is "win",
"loss" or "draw" for each player once the game is over.
"""

from __future__ import annotations

import random

from ludic.envs.env import LudicEnv
from ludic.envs.tic_tac_toe_board import (
    OPPONENTS,
    bot_move,
    empty_cells,
    other,
    parse_cell,
    render,
    winner,
)
from ludic.types import Info, StepOutcome

SYSPROMPT = (
    "You are playing Tic-Tac-Toe. Cells are numbered 1-9, left to right, top to bottom; "
    "free cells show their number. Get three of your marks in a row to win. "
    "Reply with the number of a free cell inside <move></move> tags, e.g. <move>5</move>."
)


class TicTacToeEnv(LudicEnv[str, str, str]):
    """Rewards: win_reward/draw_reward/loss_reward at the end, illegal_move_reward per bad move."""

    def __init__(
        self,
        *,
        two_player: bool = False,
        opponent: str = "heuristic",
        agent_starts: bool = True,
        win_reward: float = 1.0,
        draw_reward: float = 0.5,
        loss_reward: float = 0.0,
        illegal_move_reward: float = -1.0,
    ) -> None:
        if opponent not in OPPONENTS:
            raise ValueError(f"TicTacToeEnv.opponent must be one of {OPPONENTS}, got {opponent!r}")
        self.two_player = two_player
        self.opponent = opponent
        self.rewards = {"win": win_reward, "draw": draw_reward, "loss": loss_reward}
        self.illegal_move_reward = illegal_move_reward
        if two_player:
            self._marks = {"x": "X", "o": "O"}
        else:
            self._marks = {"agent_0": "X" if agent_starts else "O"}
        self.board: list[str] = [" "] * 9
        self.to_move = "X"
        self.done = False
        self._rng = random.Random(0)

    @property
    def agent_ids(self) -> list[str]:
        return list(self._marks)

    @property
    def active_agents(self) -> list[str]:
        if self.done:
            return []
        return [aid for aid, mark in self._marks.items() if mark == self.to_move]

    @property
    def suggested_sysprompt(self) -> str | None:
        return SYSPROMPT

    def reset(self, seed: int | None = None) -> dict[str, tuple[str, Info]]:
        self._rng = random.Random(seed)
        self.board = [" "] * 9
        self.to_move = "X"
        self.done = False
        note = ""
        if not self.active_agents:  # vs bot, bot opens
            note = self._bot_plays()
        return {aid: (note + self._view(aid), {"mark": mark}) for aid, mark in self._marks.items()}

    def step(self, actions: dict[str, str]) -> dict[str, StepOutcome]:
        if self.done:
            raise RuntimeError("TicTacToeEnv: the game is over; call reset()")
        extra = sorted(set(actions) - set(self.active_agents))
        if extra:
            raise KeyError(f"TicTacToeEnv: {extra} may not act now; active: {self.active_agents}")
        mover = self.active_agents[0] if self.active_agents else None
        if mover is None or mover not in actions:  # seat without an agent: the env plays it
            note = self._bot_plays()
            return self._outcomes(mover_id=None, note=note)
        cell, reason = parse_cell(actions[mover], self.board)
        if cell is None:
            return self._illegal(mover, f"Illegal move: {reason}. Free cells: {empty_cells(self.board)}.\n")
        self._place(cell)
        note = ""
        if not self.two_player and not self.done:
            note = self._bot_plays()
        return self._outcomes(mover_id=mover, note=note, move=cell)

    # --- internals ----------------------------------------------------------------------
    def _place(self, cell: int) -> None:
        self.board[cell - 1] = self.to_move
        self.to_move = other(self.to_move)
        self.done = winner(self.board) is not None or not empty_cells(self.board)

    def _bot_plays(self) -> str:
        mark = self.to_move
        cell = bot_move(self.board, mark, self.opponent, self._rng)
        self._place(cell)
        return f"Opponent ({mark}) played {cell}.\n"

    def _result(self, aid: str) -> str | None:
        if not self.done:
            return None
        w = winner(self.board)
        if w is None:
            return "draw"
        return "win" if w == self._marks[aid] else "loss"

    def _view(self, aid: str) -> str:
        mark = self._marks[aid]
        head = f"You are {mark}. Board:\n{render(self.board)}\n"
        result = self._result(aid)
        if result is not None:
            return head + {"win": "You won.", "loss": "You lost.", "draw": "Draw."}[result]
        if self.to_move == mark:
            return head + "Your move: reply with the number of a free cell."
        return head + "Waiting for the opponent."

    def _outcomes(self, mover_id: str | None, note: str, move: int | None = None) -> dict[str, StepOutcome]:
        out = {}
        for aid in self._marks:
            result = self._result(aid)
            info: Info = {"illegal_move": False, "move": move if aid == mover_id else None}
            if result is not None:
                info["result"] = result
            reward = self.rewards[result] if result is not None else 0.0
            out[aid] = StepOutcome(note + self._view(aid), reward, False, self.done, info)
        return out

    def _illegal(self, mover: str, message: str) -> dict[str, StepOutcome]:
        out = {}
        for aid in self._marks:
            bad = aid == mover
            info: Info = {"illegal_move": bad, "move": None}
            obs = (message if bad else "") + self._view(aid)
            out[aid] = StepOutcome(obs, self.illegal_move_reward if bad else 0.0, False, False, info)
        return out
