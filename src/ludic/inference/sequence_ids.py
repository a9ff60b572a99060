"""Prompt ids that extend the previous call's exact ids (multi-turn as one sequence).

Re-rendering the whole history each turn re-tokenises the model's earlier replies, which need not
give back the ids it sampled. Instead, the next prompt is

    previous prompt ids + previous completion ids (as sampled) + ids of what the template adds after

where "what the template adds" (the end of the assistant turn, the new messages, the generation
prompt) is found by rendering the history as text twice and taking the difference. That only works
when the template renders the earlier turns unchanged and the reply exactly as the model wrote it;
when it does not (a template that rewrites earlier turns, e.g. dropping old ``<think>`` blocks, or a
context that edits the history), ``extend_prompt_ids`` returns the reason and the caller falls back
to a full re-render (and training to per-step items).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ludic.types import Message


@dataclass
class LastCall:
    """What the previous model call sent and got: the messages, and the exact ids."""

    messages: list[Message]
    prompt_ids: list[int]
    completion_ids: list[int]
    reply_text: str


def render_text(tokenizer: Any, messages: list[Message], tools: Any, *, generation_prompt: bool) -> str:
    extra = {} if tools is None else {"tools": tools}
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=generation_prompt, tokenize=False, **extra
    )


def extend_prompt_ids(
    tokenizer: Any, last: LastCall, messages: list[Message], tools: Any = None
) -> tuple[list[int] | None, str]:
    """(the next prompt's ids, "") when the template extends ``last``; else (None, why not)."""
    n = len(last.messages)
    if len(messages) <= n or messages[:n] != last.messages:
        return None, "the context rewrote or dropped earlier messages"
    if messages[n].get("role") != "assistant":
        return None, "the reply was not recorded as the next message"
    before = render_text(tokenizer, last.messages, tools, generation_prompt=True)
    with_reply = render_text(tokenizer, messages[: n + 1], tools, generation_prompt=False)
    after = render_text(tokenizer, messages, tools, generation_prompt=True)
    if not with_reply.startswith(before + last.reply_text):
        return None, "the chat template does not render the reply exactly as sampled after the prompt"
    if not after.startswith(with_reply):
        return None, "the chat template renders earlier turns differently once new messages follow"
    closing = with_reply[len(before) + len(last.reply_text) :]
    eos = getattr(tokenizer, "eos_token", None)
    if eos and last.completion_ids and last.completion_ids[-1] == tokenizer.eos_token_id and closing.startswith(eos):
        closing = closing[len(eos) :]  # the sampled completion already ends with the end-of-turn token
    suffix = tokenizer.encode(closing + after[len(with_reply) :], add_special_tokens=False)
    return [*last.prompt_ids, *last.completion_ids, *suffix], ""
