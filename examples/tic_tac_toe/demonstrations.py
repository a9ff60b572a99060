"""SFT demonstrations for Tic-Tac-Toe: games where X follows the heuristic bot's policy.

Each agent turn becomes one SAW item whose prompt is the whole dialog so far, rendered with the
chat template exactly as the Agent (FullDialog + the env's system prompt) would send it, and
whose action is ``<move>N</move>`` plus the end-of-turn token.
"""

from __future__ import annotations

import random
from typing import Any

from ludic.agents.prompt_ids import chat_template_ids
from ludic.envs import TicTacToeEnv
from ludic.envs.tic_tac_toe_board import bot_move
from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.types import SAWItem


def game_turns(seed: int, *, opponent: str = "random") -> list[tuple[list[dict[str, str]], str]]:
    """``(messages before the move, reply)`` for each of X's turns in one game."""
    env = TicTacToeEnv(opponent=opponent)
    obs, _ = env.reset(seed=seed)["agent_0"]
    rng = random.Random(seed)
    messages = [{"role": "system", "content": env.suggested_sysprompt}, {"role": "user", "content": obs}]
    turns = []
    while not env.done:
        reply = f"<move>{bot_move(env.board, 'X', 'heuristic', rng)}</move>"
        turns.append((list(messages), reply))
        outcome = env.step({"agent_0": reply[6:-7]})["agent_0"]
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": outcome.obs}]
    return turns


def demonstration_items(
    tokenizer: Any, *, seeds: range | list[int], opponent: str = "random"
) -> list[SAWItem]:
    """One SAW item per X move over the games with these seeds."""
    items = []
    eos = int(tokenizer.eos_token_id)
    for seed in seeds:
        for i, (messages, reply) in enumerate(game_turns(seed, opponent=opponent)):
            prompt = chat_template_ids(tokenizer, messages)
            answer = [*tokenizer.encode(reply, add_special_tokens=False), eos]
            items.append(
                prompt_completion_item(
                    prompt, answer, weight=1.0, meta={"rollout_id": f"demo-{seed}", "step_index": i}
                )
            )
    return items
