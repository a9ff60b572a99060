"""(prompt, answer) pairs as SFT items, tokenised exactly as an Agent will see the prompt.

The prompt goes through the tokenizer's chat template with the generation prompt appended (what
``Agent`` sends the engine); the answer follows as plain tokens plus the end-of-turn token, so the
model also learns to stop. Only the answer and end-of-turn tokens are trained (``action_mask``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ludic.inference.template_ids import chat_template_ids
from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.types import SAWItem
from ludic.types import Message

Prompt = str | Sequence[Message]
"""A user message's text, or the whole message list the agent will send (system, user, ...)."""


def end_of_turn_id(tokenizer: Any) -> int:
    """The token that ends an assistant turn: the tokenizer's eos (what the embedded engine stops on)."""
    if getattr(tokenizer, "eos_token_id", None) is None:
        raise ValueError(
            f"{type(tokenizer).__name__} has no eos_token_id; pass end_of_turn_id= (the id that ends a turn)"
        )
    return int(tokenizer.eos_token_id)


def prompt_messages(prompt: Prompt, system_prompt: str | None = None) -> list[Message]:
    """The message list for ``prompt`` (a string is one user message), with an optional system prompt."""
    if isinstance(prompt, str):
        messages: list[Message] = [{"role": "user", "content": prompt}]
    else:
        messages = [dict(m) for m in prompt]  # type: ignore[misc]
    if system_prompt is not None:
        if messages and messages[0].get("role") == "system":
            raise ValueError("the prompt already starts with a system message; drop system_prompt=")
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def sft_item(
    tokenizer: Any,
    prompt: Prompt,
    answer: str,
    *,
    system_prompt: str | None = None,
    end_of_turn: int | None = None,
    weight: float = 1.0,
    meta: Mapping[str, Any] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> SAWItem:
    """One SFT item: chat-templated prompt (masked out), then ``answer`` + end-of-turn (trained).

    ``tools`` are rendered into the prompt as an agent's ``tools=`` are, so the item's prompt ids are the ids
    a tool-using agent sends."""
    if not isinstance(answer, str) or not answer:
        raise ValueError(f"sft_item needs a non-empty answer string, got {answer!r}")
    tool_list = None if tools is None else [dict(t) for t in tools]
    prompt_ids = chat_template_ids(tokenizer, prompt_messages(prompt, system_prompt), tools=tool_list)
    answer_ids = [int(t) for t in tokenizer.encode(answer, add_special_tokens=False)]
    answer_ids.append(end_of_turn if end_of_turn is not None else end_of_turn_id(tokenizer))
    item_meta = {"prompt_length": len(prompt_ids), "completion_length": len(answer_ids), **(meta or {})}
    return prompt_completion_item(prompt_ids, answer_ids, weight=weight, meta=item_meta)


def sft_items(
    tokenizer: Any,
    pairs: Iterable[tuple[Prompt, str]],
    *,
    system_prompt: str | None = None,
    end_of_turn: int | None = None,
) -> list[SAWItem]:
    """``sft_item`` for every (prompt, answer) pair; feed them to ``OfflineBatchSource`` + ``make_sft``."""
    items = []
    for i, (prompt, answer) in enumerate(pairs):
        items.append(
            sft_item(
                tokenizer, prompt, answer, system_prompt=system_prompt, end_of_turn=end_of_turn,
                meta={"rollout_id": f"sft-{i}", "step_index": 0},
            )
        )  # fmt: skip
    return items
