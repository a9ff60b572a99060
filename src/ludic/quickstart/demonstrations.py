"""Synthetic demonstrations of the quickstart task, as SAW items for an SFT warm start.

A from-scratch policy almost never emits the right letter, so GRPO groups would all tie at
zero reward. A short SFT pass on correct answers gives RL something to sharpen; kept short on
purpose so most of the gain comes from RL (see NOTES-CPU.md: 100 SFT steps solve it outright).
"""

from __future__ import annotations

from typing import Any

from ludic.agents.prompt_ids import chat_template_ids
from ludic.quickstart.task import LETTERS, letter_for_seed, prompt_for, target_for
from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.types import SAWItem


def end_of_turn_id(tokenizer: Any) -> int:
    """The token that ends an assistant turn (what the engine stops on)."""
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos_token_id; demonstrations need an end-of-turn token")
    return int(tokenizer.eos_token_id)


def demonstration_item(
    tokenizer: Any, *, seed: int, count: int = 4, letters: str = LETTERS, system_prompt: str | None = None
) -> SAWItem:
    """One correct answer for env seed ``seed``: prompt tokens (masked out) + answer + end of turn."""
    letter = letter_for_seed(seed, letters)
    messages = [{"role": "user", "content": prompt_for(letter, count)}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    prompt_ids = chat_template_ids(tokenizer, messages)  # exactly as the Agent builds them
    answer_ids = list(tokenizer.encode(target_for(letter, count), add_special_tokens=False))
    answer_ids.append(end_of_turn_id(tokenizer))
    return prompt_completion_item(
        prompt_ids,
        answer_ids,
        weight=1.0,
        meta={
            "rollout_id": f"demo-{seed}",
            "step_index": 0,
            "letter": letter,
            "prompt_length": len(prompt_ids),
            "completion_length": len(answer_ids),
        },
    )


def demonstration_items(
    tokenizer: Any, *, seeds: range | list[int], count: int = 4, letters: str = LETTERS
) -> list[SAWItem]:
    """Demonstrations for every seed in ``seeds`` (use seeds disjoint from the held-out eval seeds)."""
    return [demonstration_item(tokenizer, seed=s, count=count, letters=letters) for s in seeds]
