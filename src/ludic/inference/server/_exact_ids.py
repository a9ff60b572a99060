"""Chat prompts that keep earlier replies' token ids verbatim (token-in for continued conversations).

An OpenAI-style program continues a conversation by sending the model's reply back as an assistant
message. Re-rendering that text through the chat template re-tokenises the reply, which need not give
back the ids the model sampled, so the next call's prompt would not extend the previous call's ids and
the calls could not train as one exact sequence. An assistant message may therefore carry
``"token_ids"``: the ``choices[0].token_ids`` this server returned for it (a reply returned as
``tool_calls`` too: its ids are the whole reply's, and the splice puts them in as sampled). The prompt is then built as

    ids of the messages before the first such reply + its token ids + ids of what the template adds
    after it (+ the next such reply's ids + ...)

with ``inference.sequence_ids.extend_prompt_ids``, the rule ``Agent(exact_sequence=True)`` uses. Where the
template renders the history differently (it drops old reasoning, say), the prompt is the plain
re-render and the response's ``sequence_break`` says why.

Each reply with ids re-renders the history before it, so the work grows with replies x history: past
``MAX_SPLICE_COST`` (a client sending thousands of replies with ids, or a huge history) the prompt is the
plain re-render too (whose length the engine checks before tokenising), and ``sequence_break`` says so.
"""

from __future__ import annotations

from typing import Any

from ludic.inference.sequence_ids import LastCall, extend_prompt_ids
from ludic.inference.server._json import BadRequest
from ludic.inference.template_ids import chat_template_ids

TOKEN_IDS_KEY = "token_ids"
MAX_SPLICE_COST = 8_000_000
"""Characters the splice may render in all, each message counted ``MESSAGE_COST`` more (about a second of
templating): the sum over replies with ids of the history rendered before each."""
MESSAGE_COST = 500
"""A message costs the template about as much as this many characters, however short it is."""


def split_reply_ids(messages: Any) -> tuple[Any, dict[int, list[int]]]:
    """(the messages without ``token_ids``, {message index: its token ids}); BadRequest names a bad entry."""
    if not isinstance(messages, list) or not any(isinstance(m, dict) and TOKEN_IDS_KEY in m for m in messages):
        return messages, {}
    plain, ids = [], {}
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or TOKEN_IDS_KEY not in msg:
            plain.append(msg)
            continue
        value = msg[TOKEN_IDS_KEY]
        if msg.get("role") != "assistant":
            raise BadRequest(f"messages[{i}].token_ids: only assistant messages may carry token ids")
        if not isinstance(value, list) or not value or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
        ):
            raise BadRequest(f"messages[{i}].token_ids must be a non-empty list of non-negative ints")
        ids[i] = value
        plain.append({k: v for k, v in msg.items() if k != TOKEN_IDS_KEY})
    return plain, ids


def spliced_prompt_ids(
    tokenizer: Any, messages: list[dict[str, Any]], reply_ids: dict[int, list[int]], tools: Any = None
) -> tuple[list[int] | None, str]:
    """(prompt ids holding each reply's ``reply_ids`` verbatim, "") or (None, why the template forbids it)."""
    order = sorted(reply_ids)
    messages = as_sampled(tokenizer, messages, reply_ids)
    first = order[0]
    if first == 0:
        return None, "messages[0]: a reply with token ids needs the messages that prompted it before it"
    cost = splice_cost(messages, order)
    if cost > MAX_SPLICE_COST:
        return None, (f"{len(order)} replies with token ids over this history cost {cost} characters of "
                      f"templating (limit MAX_SPLICE_COST={MAX_SPLICE_COST}): the prompt was re-rendered")  # fmt: skip
    prompt = chat_template_ids(tokenizer, messages[:first], tools=tools)
    for here, nxt in zip(order, [*order[1:], len(messages)]):
        last = LastCall(messages[:here], prompt, reply_ids[here], messages[here].get("content") or "")
        prompt, why = extend_prompt_ids(tokenizer, last, messages[:nxt], tools)
        if prompt is None:
            return None, f"messages[{here}]: {why}"
    return prompt, ""


def as_sampled(tokenizer: Any, messages: list[dict[str, Any]], reply_ids: dict[int, list[int]]) -> list[dict[str, Any]]:
    """Replies sent back as ``tool_calls`` (the server read the calls out of them), as the text that was sampled.

    The template would re-serialise the calls its own way; the splice needs the reply exactly as the
    model wrote it, which its ids spell (less the end-of-turn token, as the engine decodes replies).
    Only the splice sees this; a splice that fails re-renders the messages as sent.
    """
    out = list(messages)
    eos = getattr(tokenizer, "eos_token_id", None)
    for i, ids in reply_ids.items():
        if out[i].get("tool_calls"):
            text_ids = ids[:-1] if ids and ids[-1] == eos else ids
            out[i] = {"role": "assistant", "content": tokenizer.decode(text_ids, skip_special_tokens=False)}
    return out


def splice_cost(messages: list[dict[str, Any]], order: list[int]) -> int:
    """What the splice would render: the history before the first reply, then before each next one."""
    rendered = [0]  # rendered[i]: the cost of messages[:i]
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        rendered.append(rendered[-1] + MESSAGE_COST + (len(content) if isinstance(content, str) else 0))
    return sum(rendered[end] for end in [*order, len(messages)])
