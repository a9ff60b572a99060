"""Tic-Tac-Toe package: env factory, agent harness and a heuristic scripted player."""

from __future__ import annotations

import random
import re
from typing import Any

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import TicTacToeEnv
from ludic.envs.tic_tac_toe_board import bot_move
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import SamplingConfig
from ludic.parsers import xml_tag_parser
from ludic.testing.scripted_client import ScriptedChatClient

_ROW = re.compile(r"^([XO1-9])\|([XO1-9])\|([XO1-9])$", re.MULTILINE)


def make_env(**kwargs: Any) -> TicTacToeEnv:
    """The env against its built-in opponent (kwargs go to TicTacToeEnv)."""
    return TicTacToeEnv(**kwargs)


def make_agent(
    client: Any, *, model: str = "policy", tokenizer: Any = None, sampling: SamplingConfig | None = None
) -> Agent:
    """Full-dialog agent answering ``<move>N</move>``; a missing tag costs -1 and is retried."""
    parser = xml_tag_parser("move", success_reward=0.0, error_reward=-1.0)
    return Agent(
        client=client, model=model, ctx=FullDialog(), parser=parser, tokenizer=tokenizer, sampling=sampling
    )


def board_from_obs(obs: str) -> tuple[list[str], str]:
    """(board, my mark) read back from the env's observation text."""
    cells = [c if c in "XO" else " " for row in _ROW.findall(obs) for c in row][-9:]
    mark = "O" if "You are O" in obs else "X"
    return cells, mark


def heuristic_client(seed: int = 0) -> ScriptedChatClient:
    """A scripted 'model' that plays the heuristic move for the board in its last user message."""
    rng = random.Random(seed)

    def reply(request: ChatCompletionRequest) -> str:
        last = next(m["content"] for m in reversed(request.messages) if m["role"] == "user")
        board, mark = board_from_obs(last)
        return f"<move>{bot_move(board, mark, 'heuristic', rng)}</move>"

    return ScriptedChatClient(reply)
