"""The agent's parser and memory for Tic-Tac-Toe: ``<move>N</move>``, the latest board and the parser's note.

``RecentMessages(keep=1)`` sends only the latest message. After a reply without a ``<move>`` tag
that message is the parser's note ("Invalid format. ..."), which holds no board: the model can then
only guess, and in measured games it never recovered (every later move was a parse error too).
``LatestBoard`` sends one user message: the latest observation that shows the board, with the note
in front when the last reply was rejected, so every prompt shows the board and has about the same
length. An illegal cell needs no special case: the env's own observation names the free cells and
shows the board.
"""

from __future__ import annotations

from ludic.context import ContextStrategy
from ludic.parsers import xml_tag_parser
from ludic.types import Info, Message, Obs

# no tag: -1, like an illegal move (the env's penalty), and the same player moves again
MOVE_PARSER = xml_tag_parser("move", success_reward=0.0, error_reward=-1.0)

BOARD_MARK = "Board:\n"  # every TicTacToeEnv observation shows the board after this


def board_prompt(board_obs: str, note: str | None = None) -> str:
    """The one user message ``LatestBoard`` sends (also used to write demonstrations)."""
    return f"{note}\n{board_obs}" if note else board_obs


def board_view(obs: str) -> str:
    """The env's view of the board (from the line holding ``Board:``), without the notes in front.

    The notes ("Opponent (O) played 4.", "Illegal move: cell 5 is already taken. ...") name taken
    cells with the same digits that mark free cells on the board, so a small model that learns
    "answer a digit shown in the prompt" is misled by them; the board alone holds the whole state.
    """
    at = obs.rfind(BOARD_MARK)
    return obs[obs.rfind("\n", 0, at) + 1 :]


class LatestBoard(ContextStrategy):
    """Sends the system prompt (if any) and one user message: ``board_prompt(latest board, note)``.

    board_only: send only the board view (``board_view``), without the env's notes in front (the
    opponent's last move, why a move was illegal); off by default (the README's figures keep them).
    """

    def __init__(self, system_prompt: str | None = None, *, board_only: bool = False) -> None:
        self.board_only = board_only
        super().__init__(system_prompt)

    def reset(self, system_prompt: str | None = None) -> None:
        super().reset(system_prompt)
        self._board: str | None = None
        self._note: str | None = None

    def on_env_reset(self, obs: Obs, info: Info) -> None:
        super().on_env_reset(obs, info)
        self._board, self._note = self._view(str(obs)), None

    def _view(self, text: str) -> str:
        return board_view(text) if self.board_only else text

    def on_after_step(self, obs: Obs | None, info: Info) -> None:
        super().on_after_step(obs, info)
        if obs is None:
            return
        text = str(obs)
        if BOARD_MARK in text:
            self._board, self._note = self._view(text), None
        else:  # the parser's note on a rejected reply: the board has not changed
            self._note = text

    def on_before_act(self) -> list[Message]:
        if self._board is None:
            raise RuntimeError("LatestBoard: no observation yet (on_env_reset was not called)")
        head: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*head, {"role": "user", "content": board_prompt(self._board, self._note)}]
