"""Synthetic demonstrations of the quickstart task, as SAW items for an SFT warm start.

A from-scratch policy almost never emits the right letter, so GRPO groups would all tie at
zero reward. A short SFT pass on correct answers gives RL something to sharpen; kept short on
purpose so most of the gain comes from RL (100 SFT steps solve the task outright on the tiny model,
leaving RL nothing to do).
"""

from __future__ import annotations

from typing import Any

from ludic.envs.letter_repeat import LETTERS, letter_for_seed, prompt_for, target_for
from ludic.training.batching import sft_item
from ludic.training.types import SAWItem


def demonstration_item(
    tokenizer: Any, *, seed: int, count: int = 4, letters: str = LETTERS, system_prompt: str | None = None
) -> SAWItem:
    """One correct answer for env seed ``seed``: prompt tokens (masked out) + answer + end of turn."""
    letter = letter_for_seed(seed, letters)
    return sft_item(
        tokenizer,
        prompt_for(letter, count),
        target_for(letter, count),
        system_prompt=system_prompt,
        meta={"rollout_id": f"demo-{seed}", "step_index": 0, "letter": letter},
    )


def demonstration_items(
    tokenizer: Any, *, seeds: range | list[int], count: int = 4, letters: str = LETTERS
) -> list[SAWItem]:
    """Demonstrations for every seed in ``seeds`` (use seeds disjoint from the held-out eval seeds)."""
    return [demonstration_item(tokenizer, seed=s, count=count, letters=letters) for s in seeds]
