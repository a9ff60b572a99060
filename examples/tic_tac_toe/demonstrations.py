"""SFT demonstrations for Tic-Tac-Toe: games where X follows the heuristic bot's policy.

Each of X's turns becomes one SFT item whose prompt is exactly what the training agent sends
(``LatestBoard``: the latest observation, no system prompt) and whose answer is
``<move>N</move>`` plus the end-of-turn token (``ludic.training.sft_items``).
"""

from __future__ import annotations

import random
from typing import Any

from ludic.envs import TicTacToeEnv
from ludic.envs.tic_tac_toe_board import bot_move
from ludic.training import SAWItem, sft_items


def game_turns(seed: int, *, opponent: str = "random") -> list[tuple[str, str]]:
    """``(observation, reply)`` for each of X's turns in one game played by the heuristic."""
    env = TicTacToeEnv(opponent=opponent)
    obs, _ = env.reset(seed=seed)["agent_0"]
    rng = random.Random(seed)
    turns = []
    while not env.done:
        reply = f"<move>{bot_move(env.board, 'X', 'heuristic', rng)}</move>"
        turns.append((obs, reply))
        obs = env.step({"agent_0": reply[6:-7]})["agent_0"].obs
    return turns


def demonstration_items(
    tokenizer: Any, *, seeds: range | list[int], opponent: str = "random"
) -> list[SAWItem]:
    """One SFT item per X move over the games with these seeds."""
    return sft_items(tokenizer, [turn for seed in seeds for turn in game_turns(seed, opponent=opponent)])
