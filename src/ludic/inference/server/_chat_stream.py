"""``stream=true`` on the chat route: OpenAI server-sent-event chunks sent as the reply is decoded.

The engine tells the handler each token as it is sampled (``complete_ids(on_token=...)``, called on the
decoding thread and handed to the event loop through a queue), so the first content arrives after the
first decoding step, not after the whole reply. What the chunks carry is what the OpenAI SDK's stream
accumulators expect: a role chunk (with the prompt's ``prompt_token_ids``, as vLLM's
``return_token_ids`` streams), content deltas, tool-call deltas, a last chunk with ``finish_reason`` and
the reply's ``token_ids`` (and log-probs when asked), a usage chunk when ``stream_options.include_usage``
asks, and ``data: [DONE]``.

What is sent as content while decoding (``ContentStream``): text that is surely not part of a stop
string (the longest one's length less one is held back, and a stop string found cuts there) nor of a
tool call (the parser's ``call_start``: Hermes text before ``<tool_call>``, or before what may be its
first characters; with tools, trailing whitespace is held too, since a reply with calls has its content
stripped). A half-decoded UTF-8 character waits for its other bytes. Content after a call's start is
held until the reply is whole and read, then sent (a later malformed call makes the whole reply plain
content, which streamed text could not take back). So the accumulated content equals the non-streamed
``message.content``, except that whitespace before a reply's first call is kept where the non-streamed
message strips it.

Tool calls stream as vLLM streams them (``ludic/inference/tool_parsers/streaming.py``): once a call's name is whole a
delta carries ``index``, ``id``, ``type`` and the name with ``arguments ""``, then each decoding step
that makes more of its arguments sure sends the next fragment; at the end the rest of each parsed
call, so a call's fragments add up to exactly its non-streamed ``arguments``. A parser without
``partial_calls`` (a user's own) has each call sent whole at the end. An error after the stream began
is sent as a ``data: {"error": ...}`` event before ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ludic.inference.tool_parsers import ParsedReply, ToolParser
from ludic.inference.tool_parsers.forcing import call_start
from ludic.inference.tool_parsers.streaming import CallStream, ToolCallDelta, call_stream
from ludic.types import ChatResponse

Finish = Callable[[ChatResponse, dict[str, Any]], tuple[dict[str, Any], ParsedReply]]
"""Builds the non-streamed response (envelope) and the read reply from the engine's answer."""


@dataclass
class ContentStream:
    """The reply's ids as they arrive, and how much of its text may go out as content yet."""

    decode: Callable[[list[int]], str]
    prefix: str = ""  # a forced call's opening: the reply's text starts with it
    stops: tuple[str, ...] = ()
    parser: ToolParser | None = None  # None: the reply is never read for calls
    ids: list[int] = field(default_factory=list)
    sent: str = ""
    calls: CallStream | None = field(init=False, default=None)  # the parser's partial_calls, if it has them
    text: str = field(init=False, default="")  # the reply so far, up to where a stop string may still cut

    def push(self, position: int, token: int) -> None:
        del self.ids[position:]  # a position seen before: the row was decoded again from there
        self.ids.append(token)

    def __post_init__(self) -> None:
        self.calls = call_stream(self.parser) if self.parser is not None else None
        self.text = self.prefix

    def delta(self) -> str:
        """The content that may be sent now beyond what was sent ("" when none)."""
        text = (self.prefix + self.decode(self.ids)).rstrip("\ufffd")  # a character still missing bytes
        safe = len(text) - max((len(s) for s in self.stops), default=1) + 1
        for stop in self.stops:
            at = text.find(stop)
            safe = min(safe, len(text) if at == -1 else at)
        self.text = text[: max(safe, 0)]  # what stop strings cannot cut any more: calls are read from it
        if self.parser is not None:
            safe = min(safe, call_start(self.parser, text))
            safe = len(text[:safe].rstrip())
        candidate = text[: max(safe, 0)]
        if len(candidate) <= len(self.sent) or not candidate.startswith(self.sent):
            return ""
        out, self.sent = candidate[len(self.sent) :], candidate
        return out

    def call_deltas(self) -> list[ToolCallDelta]:
        """The tool-call deltas the reply so far adds (after ``delta``; none for a parser without ``partial_calls``)."""
        return self.calls.update(self.text) if self.calls is not None else []

    def rest(self, content: str | None) -> str:
        """What of the read reply's ``content`` was not streamed yet."""
        content = content or ""
        for sent in (self.sent, self.sent.lstrip()):
            if content.startswith(sent):
                return content[len(sent) :]
        return ""  # streamed text cannot be taken back; the last chunk's token_ids are the reply


async def stream_chat(
    request: web.Request,
    prompt_ids: list[int],
    run: Callable[[Callable[[int, int], None]], Any],
    content: ContentStream,
    finish: Finish,
    *,
    model: str,
    include_usage: bool,
) -> web.StreamResponse:
    """Start ``run(sink)`` (the engine's ``complete_ids`` with ``on_token=sink``) and stream its reply.

    An error before the first token (overload, a refused request) is raised as for a non-streamed call,
    so it keeps its HTTP status; the client disconnecting cancels the generation."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()
    task = asyncio.ensure_future(run(lambda pos, tok: loop.call_soon_threadsafe(queue.put_nowait, (pos, tok))))
    task.add_done_callback(lambda _: queue.put_nowait(None))  # after every token: the engine answers last
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model}  # fmt: skip

    def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, **extra}
        return {**head, "choices": [choice]}

    try:
        item = await queue.get()
        if item is None:
            task.result()  # raises the engine's refusal with its own status
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        await _send(response, {**chunk({"role": "assistant", "content": ""}), "prompt_token_ids": prompt_ids})
        done = item is None
        if not done:
            content.push(*item)
        while not done:
            while not done and not queue.empty():  # catch up: one decode for the tokens that came meanwhile
                item = queue.get_nowait()
                done = item is None
                if not done:
                    content.push(*item)
            if delta := content.delta():
                await _send(response, chunk({"content": delta}))
            for call in content.call_deltas():
                await _send(response, chunk({"tool_calls": [call.as_openai()]}))
            if not done:
                item = await queue.get()
                done = item is None
                if not done:
                    content.push(*item)
        try:
            envelope, parsed = finish(*task.result())
        except Exception as exc:  # after the headers went out: an error event, then the end
            await _send(response, {"error": {"message": f"{type(exc).__name__}: {exc}"[:1000], "code": 500}})
            return await _end(response)
        calls = content.calls.finish(parsed.tool_calls) if content.calls is not None else whole_calls(parsed)
        for out in final_chunks(envelope, calls, content.rest(parsed.content), chunk, include_usage, head):
            await _send(response, out)
        return await _end(response)
    finally:
        if not task.done():
            task.cancel()


def whole_calls(parsed: ParsedReply) -> list[ToolCallDelta]:
    """Each call sent whole at the end (a parser without ``partial_calls``): named, then all its arguments."""
    out = []
    for i, call in enumerate(parsed.tool_calls):
        out += [ToolCallDelta(i, "", call.id, call.name), ToolCallDelta(i, call.arguments)]
    return out


def final_chunks(envelope: dict[str, Any], calls: list[ToolCallDelta], rest: str, chunk: Callable[..., dict[str, Any]],
                 include_usage: bool, head: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    """The chunks once the reply is whole: content not yet sent, what is left of the calls, the finish, usage."""
    choice = envelope["choices"][0]
    out = [chunk({"content": rest})] if rest else []
    out += [chunk({"tool_calls": [call.as_openai()]}) for call in calls]
    last = {k: choice[k] for k in ("token_ids", "weight_versions", "logprobs", "text", "forced_token_ids",
                                   "tool_choice_unmet") if k in choice}  # fmt: skip
    out.append(chunk({}, choice["finish_reason"], **last))
    if include_usage:
        out.append({**head, "choices": [], "usage": envelope["usage"]})
    return out


async def _send(response: web.StreamResponse, obj: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(obj).encode() + b"\n\n")


async def _end(response: web.StreamResponse) -> web.StreamResponse:
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
