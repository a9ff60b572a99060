"""SFT demonstrations for Tic-Tac-Toe: games where X plays a bot's moves ("random" legal cells or the "heuristic").

Each of X's turns becomes one SFT item whose prompt is exactly what the training agent sends
(``LatestBoard``: the latest observation or its board view, no system prompt) and whose answer is
``<move>N</move>`` plus the end-of-turn token (``ludic.training.sft_items``).
"""

from __future__ import annotations

import random
from typing import Any

from board_context import board_view

from ludic.envs import TicTacToeEnv
from ludic.envs.tic_tac_toe_board import bot_move
from ludic.training import SAWItem, sft_items


def game_turns(
    seed: int, *, opponent: str = "random", player: str = "heuristic", board_only: bool = False
) -> list[tuple[str, str]]:
    """``(prompt, reply)`` for each of X's turns in one game where X plays ``player``'s moves.

    The prompt is what ``LatestBoard(board_only=board_only)`` sends: the observation, or its board view.
    """
    env = TicTacToeEnv(opponent=opponent)
    obs, _ = env.reset(seed=seed)["agent_0"]
    rng = random.Random(seed)
    turns = []
    while not env.done:
        reply = f"<move>{bot_move(env.board, 'X', player, rng)}</move>"
        turns.append((board_view(obs) if board_only else obs, reply))
        obs = env.step({"agent_0": reply[6:-7]})["agent_0"].obs
    return turns


def demonstration_items(
    tokenizer: Any,
    *,
    seeds: range | list[int],
    opponent: str = "random",
    player: str = "heuristic",
    board_only: bool = False,
) -> list[SAWItem]:
    """One SFT item per X move over the games with these seeds."""
    turns = [t for seed in seeds for t in game_turns(seed, opponent=opponent, player=player, board_only=board_only)]
    return sft_items(tokenizer, turns)
