"""A loopback relay that records every model call a verifiers episode makes, per agent run, exactly.

Why a relay on a socket (``ludic.inference.call_recorder`` prefers an in-process transport): a verifiers
``Env`` reaches the model from its harness program, a separate process, through verifiers' interception
server, whose client posts to ``ModelContext.client.base_url``. Pointing that base URL here puts every
call of the episode through Ludic's ``CallRecorder`` (exact prompt / completion ids, sampling log-probs,
temperature, policy version; replies sent back with their ids), one recorder per agent run: verifiers
sends each run's trace id as ``X-Session-ID``.

verifiers' chat programs stream (``stream=True``); Ludic's server answers whole completions, and a
streamed call cannot be recorded. The relay asks upstream without streaming and replays the finished
completion to the program as server-sent events (one content chunk, one finish chunk, the usage
chunk when asked, ``[DONE]``), so the program reads the same reply the recorder kept.

A body that is not a JSON object (or a bad ``stream_options``) is a 400 and a refusal of that run; an
episode opens at most ``max_sessions`` runs (each has its own ``max_calls`` budget and recorder), and
a call for one more is a 429 recorded in ``errors``: the episode fails, memory stays bounded.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiohttp import web

from ludic.inference.call_recorder import (
    MAX_KEPT_ERRORS,
    CallRecorder,
    CallRecordError,
    RecordedCall,
    RecordingAsyncTransport,
)

SESSION_HEADER = "X-Session-ID"
"""verifiers' per-run header (``verifiers.v1.clients.client.SESSION_ID_HEADER``): the run's trace id."""

_DELTA_FIELDS = ("content", "tool_calls", "reasoning_content")


@dataclass
class CallRelay:
    """Records the chat calls of one episode by agent run; ``async with`` serves it on 127.0.0.1.

    upstream: the model server's OpenAI root (``http://127.0.0.1:8000/v1``). max_calls: per agent run.
    defaults: sampling fields for calls that leave them out. seed_base: per-call seeds (run k's calls
    get ``seed_base + k * 1000 + i``); None sends no seed. max_sessions: agent runs (``X-Session-ID``
    values) one episode may open; ``errors`` says why a call was refused before any run could own it.
    """

    upstream: str
    max_calls: int = 64
    defaults: dict[str, Any] = field(default_factory=dict)
    seed_base: int | None = None
    max_sessions: int = 256
    errors: list[str] = field(default_factory=list)
    recorders: dict[str, CallRecorder] = field(default_factory=dict)
    _clients: dict[str, httpx.AsyncClient] = field(default_factory=dict)
    _runner: web.AppRunner | None = None
    base_url: str = ""

    async def __aenter__(self) -> CallRelay:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for recorder in self.recorders.values():
            recorder.seal()
        for client in self._clients.values():
            await client.aclose()
        if self._runner is not None:
            await self._runner.cleanup()

    def calls(self, session: str) -> list[RecordedCall]:
        recorder = self.recorders.get(session)
        return list(recorder.calls) if recorder else []

    def problems(self, session: str) -> list[str]:
        """Why a run's calls cannot all be trained (refused or unrecorded calls, calls still in flight)."""
        recorder = self.recorders.get(session)
        if recorder is None:
            return []
        late = [f"{recorder.in_flight} model call(s) still in flight"] if recorder.in_flight else []
        more = recorder.error_count - len(recorder.errors)
        return [*recorder.errors, *([f"{more} more refused"] if more else []), *late]

    def _client(self, session: str) -> httpx.AsyncClient:
        if session not in self._clients:
            if len(self._clients) >= self.max_sessions:
                why = f"more than {self.max_sessions} agent runs ({SESSION_HEADER} values) in one episode"
                if len(self.errors) < MAX_KEPT_ERRORS:
                    self.errors.append(why)
                raise CallRecordError(why)
            seed = None if self.seed_base is None else self.seed_base + 1000 * len(self.recorders)
            recorder = CallRecorder(max_calls=self.max_calls, defaults=dict(self.defaults), seed_base=seed)
            self.recorders[session] = recorder
            self._clients[session] = httpx.AsyncClient(
                transport=RecordingAsyncTransport(recorder), timeout=None
            )
        return self._clients[session]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        session = request.headers.get(SESSION_HEADER, "")
        try:
            client = self._client(session)
        except CallRecordError as exc:
            return _error(429, str(exc))
        body, why = await _read_body(request)
        if why:  # the run's refusal: its episode fails naming it
            self.recorders[session].refuse(why)
            return _error(400, why)
        stream = bool(body.pop("stream", False))
        usage_asked = bool((body.pop("stream_options", None) or {}).get("include_usage"))
        try:
            upstream = await client.post(f"{self.upstream.rstrip('/')}/chat/completions", json=body)
        except Exception as exc:  # refused by the recorder or no connection: the recorder keeps why
            return _error(502, f"ludic relay: {exc}")
        if upstream.status_code != 200 or not stream:
            return web.Response(
                body=upstream.content, status=upstream.status_code, content_type="application/json"
            )
        return await _as_events(request, upstream.json(), usage_asked)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


async def _read_body(request: web.Request) -> tuple[dict[str, Any], str]:
    """(the chat body, "") or ({}, why it cannot be relayed)."""
    try:
        body = json.loads(await request.read())
    except web.HTTPRequestEntityTooLarge as exc:
        return {}, f"chat request body over the relay's limit: {exc.text}"
    except (ValueError, RecursionError) as exc:
        return {}, f"chat request body is not valid JSON: {str(exc)[:200]}"
    if not isinstance(body, dict):
        return {}, f"chat request body is a JSON {type(body).__name__}, not an object"
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return {}, f"stream_options must be a JSON object, got {type(options).__name__}"
    return body, ""


async def _as_events(
    request: web.Request, completion: dict[str, Any], usage_asked: bool
) -> web.StreamResponse:
    """A finished chat completion replayed as the chunk stream an OpenAI SDK reads."""
    choice = completion["choices"][0]
    message = choice.get("message") or {}
    delta = {"role": "assistant", **{k: message[k] for k in _DELTA_FIELDS if message.get(k) is not None}}
    if "tool_calls" in delta:
        delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(delta["tool_calls"])]
    head = {"id": completion.get("id", "chatcmpl-ludic"), "object": "chat.completion.chunk",
            "created": completion.get("created", int(time.time())), "model": completion.get("model", "")}  # fmt: skip
    events = [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {
            **head,
            "choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason") or "stop"}],
        },
    ]
    if usage_asked and completion.get("usage"):
        events.append({**head, "choices": [], "usage": completion["usage"]})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for event in events:
        await response.write(f"data: {json.dumps(event)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
