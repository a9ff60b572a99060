"""``stream=true`` on the chat route: the finished reply sent as OpenAI server-sent-event chunks.

The engine decodes a whole batch before it answers, so the chunks go out once the reply is complete
(first-token latency is the whole reply's); what they carry is what the OpenAI SDK's stream
accumulators expect: a role chunk, the content, each tool call as ``index``/``id``/``type``/name
with empty ``arguments`` then its ``arguments``, a last chunk with ``finish_reason``, a usage chunk
when ``stream_options.include_usage`` asks for it, and ``data: [DONE]``. The last chunk's choice
also carries the reply's ``token_ids`` (and the first chunk ``prompt_token_ids``), as vLLM's
``return_token_ids`` streams do, so a streamed reply keeps its exact ids too.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ludic.inference.tool_parsers import ParsedReply


def stream_chunks(envelope: dict[str, Any], parsed: ParsedReply, include_usage: bool) -> list[dict[str, Any]]:
    """The chunk objects of one finished chat completion (``envelope``: the non-streamed response)."""
    choice = envelope["choices"][0]
    head = {k: envelope[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}]}

    chunks = [{**chunk({"role": "assistant", "content": ""}), "prompt_token_ids": envelope["prompt_token_ids"]}]
    if parsed.content:
        chunks.append(chunk({"content": parsed.content}))
    for i, call in enumerate(parsed.tool_calls):
        entry = call.as_openai()
        named = {"index": i, "id": entry["id"], "type": "function", "function": {"name": call.name, "arguments": ""}}
        chunks.append(chunk({"tool_calls": [named]}))
        chunks.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]}))
    last = {k: choice[k] for k in ("token_ids", "weight_versions", "logprobs") if k in choice}
    chunks.append(chunk({}, choice["finish_reason"], **last))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": envelope["usage"]})
    return chunks


async def send_stream(request: web.Request, chunks: list[dict[str, Any]]) -> web.StreamResponse:
    """Write the chunks as ``text/event-stream`` and end with ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
