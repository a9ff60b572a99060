"""Record every chat call an OpenAI-SDK program makes, at the HTTP level, with its exact token ids.

An agent program gets a stock ``openai.AsyncOpenAI`` / ``openai.OpenAI`` whose ``http_client`` sends
through ``RecordingAsyncTransport`` / ``RecordingTransport``. Why a transport and not a recording
proxy on its own port: it sits in the episode's own process and client, so each episode's calls are
its own with no routing by URL or header, nothing else listens on a socket, and it sees the exact
request body (the temperature the program asked for) and response body (the ids the server sampled).

Per ``POST .../chat/completions`` the transport:
- asks for ids and log-probs (``return_token_ids``, ``logprobs``) and fills the sampling fields the
  program left out from ``defaults`` (a seed per call when the episode has one);
- gives each assistant message whose text is a reply recorded earlier in the episode (or whose
  ``tool_calls`` are the ones the server read out of one, found by their ids) that reply's ``token_ids``, so a server that accepts them (Ludic's) continues the conversation on the sampled
  ids instead of re-tokenising the reply (vLLM does not: pass ``attach_token_ids=False``);
- records prompt ids, completion ids, log-probs, temperature, top_p and policy version; a response
  without them, an error status or a streamed call is an error of the episode, never a silent gap.
Other requests pass through unrecorded, among them chat calls to another server than ``policy_url``
(``client.with_options(base_url=...)`` shares the transport: a judge model is not the policy). A field sent as ``null`` means the default (as in the OpenAI
API) and ``temperature`` / ``top_p`` are always sent, so what is recorded is what the server used
(vLLM would otherwise take the model's generation-config defaults). A call made from another
episode (a client kept across episodes) is refused and fails the episode that made it. Refusals are
counted; the first ``MAX_KEPT_ERRORS`` are kept word for word (a program looping on refused calls, or
an abandoned thread calling after its episode ended, cannot grow memory).
"""

from __future__ import annotations

import json
import threading
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import httpx

from ludic.types import TokenTrace

SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}
"""Sent when neither the program nor the run sets them (the OpenAI API's defaults)."""
MAX_KEPT_ERRORS = 8
"""Refusal messages kept per episode; later refusals are only counted (``error_count``)."""

EPISODE: ContextVar[CallRecorder | None] = ContextVar("ludic_episode_recorder", default=None)
"""The recorder of the episode whose program is running here (set by the protocol; tasks and
``asyncio.to_thread`` inherit it): a call through another episode's client is refused."""


class CallRecordError(RuntimeError):
    """A call the recorder refused or could not record (the episode cannot be trained)."""


@dataclass
class RecordedCall:
    """One model call as sampled: the exact ids, log-probs and the distribution they came from."""

    trace: TokenTrace
    text: str
    messages: list[dict[str, Any]]
    temperature: float
    top_p: float
    policy_version: int | None
    server_sequence_break: str | None = None
    """Why the server could not keep earlier replies' ids verbatim (None when it did, or was not asked)."""
    tool_call_ids: tuple[str, ...] = ()
    """The ids of the ``tool_calls`` the server read out of the reply (the message sent back carries them)."""
    forced_ids: tuple[int, ...] = ()
    """A forced tool call's opening (``tool_choice``): the last prompt ids, which the reply's text starts with."""

    @property
    def reply_ids(self) -> list[int]:
        """The reply as the next prompt must hold it: a forced opening, then what was sampled."""
        return [*self.forced_ids, *self.trace.completion_token_ids]


@dataclass
class CallRecorder:
    """The calls of one episode. ``seal()`` ends it: later calls are refused (a timed-out program)."""

    max_calls: int = 64
    defaults: dict[str, Any] = field(default_factory=dict)
    seed_base: int | None = None
    attach_token_ids: bool = True
    calls: list[RecordedCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    error_count: int = 0
    in_flight: int = 0
    sealed: bool = False
    _started: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def prepare(self, body: Any) -> dict[str, Any]:
        """The body to send for a chat call; raises CallRecordError (and remembers why) if refused."""
        caller = EPISODE.get()
        if caller is not None and caller is not self:  # the refusal fails the episode that made the call
            why = ("model call through another episode's client (a client kept from an earlier or concurrent "
                   "episode): use the client each episode is given")  # fmt: skip
            caller.refuse(why)
            raise CallRecordError(why)
        if isinstance(body, dict):  # null means "the default" in the OpenAI API
            body = {k: v for k, v in body.items() if v is not None}
        with self._lock:
            why = self._refusal(body)
            if why:
                self._count_error(why)
                raise CallRecordError(why)
            sent = {**SAMPLING_DEFAULTS, **self.defaults, **body, "return_token_ids": True, "logprobs": True}
            if self.seed_base is not None and "seed" not in body:
                sent["seed"] = self.seed_base + self._started
            if self.attach_token_ids:
                sent["messages"] = self._with_reply_ids(body["messages"])
            self._started += 1
            self.in_flight += 1
            return sent

    def refuse(self, why: str) -> None:
        """Fail the episode with ``why`` (a call refused before it reached this recorder)."""
        with self._lock:
            self._count_error(why)

    def _count_error(self, why: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_KEPT_ERRORS:
            self.errors.append(why)

    def _refusal(self, body: Any) -> str:
        if self.sealed:
            return "call after the episode ended (the program outlived its timeout or returned)"
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return "chat request body is not a JSON object with a messages list"
        if body.get("stream"):
            return "streamed chat calls cannot be recorded: call without stream=True"
        if body.get("n", 1) != 1:
            return f"n={body['n']!r:.40}: record one completion per call (make n calls)"
        if self._started >= self.max_calls:
            return f"more than {self.max_calls} model calls in one episode (max_steps)"
        return ""

    def _with_reply_ids(self, messages: list[Any]) -> list[Any]:
        by_text = {call.text: call.reply_ids for call in self.calls}
        by_call_id = {i: call.reply_ids for call in self.calls for i in call.tool_call_ids}
        out = []
        for msg in messages:
            if isinstance(msg, dict) and msg.get("role") == "assistant" and "token_ids" not in msg:
                content = msg.get("content")  # text only: content parts are the server's to accept or refuse
                ids = by_text.get(content) if isinstance(content, str) else None
                calls = msg.get("tool_calls")  # a reply returned as tool_calls: found by its calls' ids
                if calls and isinstance(calls, list) and isinstance(calls[0], dict):
                    ids = by_call_id.get(calls[0].get("id"))  # type: ignore[arg-type]
                msg = {**msg, "token_ids": ids} if ids is not None else msg
            out.append(msg)
        return out

    def record(self, sent: dict[str, Any], status: int, payload: bytes) -> None:
        """Keep the call's ids, or the reason they cannot be kept."""
        with self._lock:
            self.in_flight -= 1
            if self.sealed:
                return
            try:
                self.calls.append(_parse_call(sent, status, payload))
            except (CallRecordError, ValueError, KeyError, TypeError, IndexError) as exc:
                self._count_error(f"call {len(self.calls) + self.error_count}: {exc}")

    def abandon(self) -> None:
        """The call raised before a response came (timeout, connection error)."""
        with self._lock:
            self.in_flight -= 1
            if not self.sealed:
                self._count_error("a model call got no response (connection error or timeout)")

    def seal(self) -> None:
        with self._lock:
            self.sealed = True


def _parse_call(sent: dict[str, Any], status: int, payload: bytes) -> RecordedCall:
    if status != 200:
        raise CallRecordError(f"server answered HTTP {status}: {payload[:300].decode(errors='replace')}")
    body = json.loads(payload)
    choice = body["choices"][0]
    prompt, completion = body.get("prompt_token_ids"), choice.get("token_ids")
    if not prompt or not completion:
        raise CallRecordError("response has no prompt_token_ids / choices[0].token_ids: the server must "
                              "return token ids (return_token_ids, as Ludic's server and vLLM do)")
    logps = [float(entry["logprob"]) for entry in ((choice.get("logprobs") or {}).get("content") or [])]
    if len(logps) != len(completion):
        raise CallRecordError(f"response has {len(logps)} log-probs for {len(completion)} completion tokens")
    calls = (choice.get("message") or {}).get("tool_calls") or []
    version = body.get("policy_version")
    if version is None and choice.get("weight_versions"):
        version = int(choice["weight_versions"][-1]["version"])
    return RecordedCall(
        trace=TokenTrace(list(prompt), list(completion), logps, choice.get("finish_reason")),
        text=choice.get("text") or (choice.get("message") or {}).get("content") or "",  # "text": the whole reply
        messages=list(sent["messages"]),
        temperature=float(sent.get("temperature", SAMPLING_DEFAULTS["temperature"])),
        top_p=float(sent.get("top_p", SAMPLING_DEFAULTS["top_p"])),
        policy_version=version,
        server_sequence_break=body.get("sequence_break"),
        tool_call_ids=tuple(str(c.get("id")) for c in calls if isinstance(c, dict)),
        forced_ids=tuple(int(t) for t in choice.get("forced_token_ids") or ()),
    )


def _is_chat(request: httpx.Request, policy: httpx.URL | None) -> bool:
    """A chat call to the policy's server (``policy``: its URL; None: any server)."""
    if request.method != "POST" or not request.url.path.rstrip("/").endswith("/chat/completions"):
        return False
    url = request.url
    return policy is None or (url.scheme, url.host, url.port) == (policy.scheme, policy.host, policy.port)


def _resend(request: httpx.Request, body: dict[str, Any]) -> httpx.Request:
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
    return httpx.Request(request.method, request.url, headers=headers, content=json.dumps(body).encode())


def _reply(response: httpx.Response, request: httpx.Request) -> httpx.Response:
    """A fresh response holding the (already read, decoded) body for the SDK to parse."""
    drop = {"content-length", "content-encoding", "transfer-encoding"}
    headers = {k: v for k, v in response.headers.items() if k.lower() not in drop}
    return httpx.Response(response.status_code, headers=headers, content=response.content, request=request)


class RecordingAsyncTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncClient(transport=...)`` for ``openai.AsyncOpenAI(http_client=...)``."""

    def __init__(
        self, recorder: CallRecorder, inner: httpx.AsyncBaseTransport | None = None, policy_url: str | None = None
    ) -> None:
        self.recorder, self.inner = recorder, inner or httpx.AsyncHTTPTransport()
        self.policy = None if policy_url is None else httpx.URL(policy_url)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not _is_chat(request, self.policy):
            return await self.inner.handle_async_request(request)
        sent = self.recorder.prepare(json.loads(await request.aread()))
        outgoing = _resend(request, sent)
        try:
            response = await self.inner.handle_async_request(outgoing)
            await response.aread()
        except BaseException:  # cancelled (a timeout) or no connection: the call left no ids
            self.recorder.abandon()
            raise
        self.recorder.record(sent, response.status_code, response.content)
        return _reply(response, outgoing)

    async def aclose(self) -> None:
        await self.inner.aclose()


class RecordingTransport(httpx.BaseTransport):
    """``httpx.Client(transport=...)`` for ``openai.OpenAI(http_client=...)`` (sync programs)."""

    def __init__(
        self, recorder: CallRecorder, inner: httpx.BaseTransport | None = None, policy_url: str | None = None
    ) -> None:
        self.recorder, self.inner = recorder, inner or httpx.HTTPTransport()
        self.policy = None if policy_url is None else httpx.URL(policy_url)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not _is_chat(request, self.policy):
            return self.inner.handle_request(request)
        sent = self.recorder.prepare(json.loads(request.read()))
        outgoing = _resend(request, sent)
        try:
            response = self.inner.handle_request(outgoing)
            response.read()
        except BaseException:
            self.recorder.abandon()
            raise
        self.recorder.record(sent, response.status_code, response.content)
        return _reply(response, outgoing)

    def close(self) -> None:
        self.inner.close()
