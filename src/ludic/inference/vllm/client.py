"""``VLLMChatClient``: the ChatClient for ``vllm serve`` or ``python -m ludic.inference.server`` over HTTP.

Token-in, token-out: a request carrying ``prompt_token_ids`` (the agent rendered the chat template)
is sent as ids, to ``/v1/completions`` (``prompt`` = ids, ``return_token_ids``, ``logprobs``) or,
with ``route="generate"``, to ``/inference/v1/generate``; completion ids, per-token log-probs,
finish reason and weight version come back. A request without ids goes to ``/v1/chat/completions``
(the server renders the template): fine for evaluation, never used for training data. For RL run
vLLM with ``--logprobs-mode processed_logprobs`` so the log-probs are of the distribution sampled.

One HTTP library (httpx) for the async and blocking paths; connection errors and 5xx are retried
with backoff, a 4xx raises ``RequestRefused`` with the server's message (``inference/http_client.py``). Weights:
``sync_weights`` uploads one safetensors blob to Ludic's ``/ludic/update_weights_blob``; for
vLLM (or a collective on Ludic's server) use ``BroadcastPolicyPublisher`` (``ludic.distributed``).
``pause`` / ``resume`` / ``is_paused`` (and ``_sync`` twins) speak vLLM's ``/pause?mode=abort|wait|keep``,
``/resume`` and ``/is_paused`` (``ludic.inference.weight_sync.pause``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import httpx

from ludic.inference.http_client import RequestRefused, RetryPolicy, ServerError
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.vllm._weights import VLLMWeightsMixin
from ludic.types import ChatResponse

ROUTES = ("completions", "generate")
__all__ = ["RequestRefused", "ServerError", "VLLMChatClient"]


class VLLMChatClient(VLLMWeightsMixin):
    """ChatClient (and VersionedClient) for a vLLM-style server at ``base_url`` or ``host:port``.

    api_key: bearer token (default ``$LUDIC_API_KEY``); route: ``"completions"`` or ``"generate"``
    for token-id requests; retries/backoff_s: attempts after a connection error or 5xx. timeout_s
    (``[timeouts].http_s``) bounds each call, retries included: past it ``ServerTimeout`` names this server,
    the route and the time waited.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        base_url: str | None = None,
        enable_weight_updates: bool = False,
        timeout_s: float = 600.0,
        max_connections: int = 256,
        api_key: str | None = None,
        route: str = "completions",
        retries: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        self.base_url = (base_url or f"http://{host}:{port}").rstrip("/")
        url = httpx.URL(self.base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"VLLMChatClient needs an http(s)://host:port URL, got {self.base_url!r}")
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
        self.host, self.port = url.host, url.port or 80
        self.enable_weight_updates = enable_weight_updates
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.route = route
        self.api_key = api_key if api_key is not None else os.environ.get("LUDIC_API_KEY")
        self.retry = RetryPolicy(retries, backoff_s)
        self._headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._async: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._sync: httpx.Client | None = None

    # ---- ChatClient -------------------------------------------------------------------------
    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        started = time.perf_counter()
        if request.prompt_token_ids is None:
            body = await self.post_json("/v1/chat/completions", self.request_body(request))
            response = self.parse_response(body)
        elif self.route == "generate":
            body = await self.post_json("/inference/v1/generate", self.generate_body(request))
            response = self.parse_generate(body, request.prompt_token_ids)
        else:
            body = await self.post_json("/v1/completions", self.completions_body(request))
            response = self.parse_completion(body, request.prompt_token_ids)
        if not request.return_logprobs:
            response.completion_logprobs = None
        return response, {"latency_s": time.perf_counter() - started, "policy_version": response.policy_version}

    @staticmethod
    def _sampling(request: ChatCompletionRequest) -> dict[str, Any]:
        s = request.sampling
        out: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_tokens}
        if s.seed is not None:
            out["seed"] = s.seed
        if s.stop:
            out["stop"] = list(s.stop)
        return out

    @classmethod
    def completions_body(cls, request: ChatCompletionRequest) -> dict[str, Any]:
        """vLLM's ``/v1/completions`` body: the prompt as token ids, ids and versions asked back."""
        return {
            "model": request.model, "prompt": list(request.prompt_token_ids or []), "n": 1, "logprobs": 0,
            "return_token_ids": True, "return_weight_versions": True, **cls._sampling(request), **request.extras,
        }  # fmt: skip

    @classmethod
    def generate_body(cls, request: ChatCompletionRequest) -> dict[str, Any]:
        """vLLM's ``/inference/v1/generate`` body: ``token_ids`` + ``sampling_params``."""
        params = {**cls._sampling(request), "logprobs": 0}
        return {"model": request.model, "token_ids": list(request.prompt_token_ids or []),
                "sampling_params": params, "return_weight_versions": True, **request.extras}  # fmt: skip

    @classmethod
    def request_body(cls, request: ChatCompletionRequest) -> dict[str, Any]:
        """The chat body (requests without token ids): the server renders the template."""
        body = {"model": request.model, "messages": wire_messages(request.messages), "n": 1, "logprobs": True,
                "return_token_ids": True, "return_weight_versions": True, **cls._sampling(request)}  # fmt: skip
        if request.tools is not None:
            body["tools"] = request.tools
        return {**body, **request.extras}

    @staticmethod
    def _version(body: dict[str, Any], choice: dict[str, Any]) -> int | None:
        """The weight version of the output: vLLM's ``weight_versions`` spans (oldest), else Ludic's field."""
        spans = choice.get("weight_versions")
        if spans:
            try:
                return int(spans[0]["version"])
            except (KeyError, TypeError, ValueError):
                pass
        version = body.get("policy_version")
        return int(version) if isinstance(version, int) else None

    @classmethod
    def parse_completion(cls, body: dict[str, Any], prompt_ids: list[int]) -> ChatResponse:
        choice = body["choices"][0]
        ids = choice.get("token_ids")
        logps = (choice.get("logprobs") or {}).get("token_logprobs")
        if ids is None or logps is None:
            raise ServerError(
                "the /v1/completions reply has no token_ids or token_logprobs; the server must support "
                "`return_token_ids` and `logprobs` (vLLM >= 0.10.2, or python -m ludic.inference.server)"
            )
        return ChatResponse(
            text=choice.get("text") or "", finish_reason=choice.get("finish_reason"),
            prompt_token_ids=list(prompt_ids), completion_token_ids=[int(t) for t in ids],
            completion_logprobs=[float(x) for x in logps], policy_version=cls._version(body, choice),
        )  # fmt: skip

    @classmethod
    def parse_generate(cls, body: dict[str, Any], prompt_ids: list[int]) -> ChatResponse:
        choice = body["choices"][0]
        content = (choice.get("logprobs") or {}).get("content")
        if choice.get("token_ids") is None or content is None:
            raise ServerError("the /inference/v1/generate reply has no token_ids or logprobs")
        return ChatResponse(
            text=choice.get("text") or "", finish_reason=choice.get("finish_reason"),
            prompt_token_ids=list(prompt_ids), completion_token_ids=[int(t) for t in choice["token_ids"]],
            completion_logprobs=[float(c["logprob"]) for c in content], policy_version=cls._version(body, choice),
        )  # fmt: skip

    @classmethod
    def parse_response(cls, body: dict[str, Any]) -> ChatResponse:
        """A chat-completion JSON as a ChatResponse; Ludic trains only on rollout-time token traces."""
        choice = body["choices"][0]
        ids, prompt_ids = choice.get("token_ids"), body.get("prompt_token_ids")
        content = (choice.get("logprobs") or {}).get("content")
        if ids is None or prompt_ids is None or content is None:
            raise ServerError(
                "the server returned no token ids or logprobs; it must support `return_token_ids` and "
                "`logprobs` (vLLM >= 0.10.2, or python -m ludic.inference.server)"
            )
        return ChatResponse(
            text=choice["message"].get("content") or "", finish_reason=choice.get("finish_reason"),
            prompt_token_ids=[int(t) for t in prompt_ids], completion_token_ids=[int(t) for t in ids],
            completion_logprobs=[float(c["logprob"]) for c in content], policy_version=cls._version(body, choice),
            tool_calls=choice["message"].get("tool_calls") or None,
        )  # fmt: skip

    async def get_policy_version(self) -> int:
        return int((await self.get_json("/policy_version"))["policy_version"])

    # ---- pause / resume (vLLM's routes; modes in ludic.inference.weight_sync.pause) -----------------------
    @staticmethod
    def pause_path(mode: str, clear_cache: bool) -> str:
        return f"/pause?mode={mode}&clear_cache={str(clear_cache).lower()}"

    async def pause(self, mode: str = "abort", *, clear_cache: bool = True) -> dict[str, Any]:
        """``POST /pause``: hold new requests; ``abort`` / ``wait`` for / freeze (``keep``) those in flight."""
        return await self.post_json(self.pause_path(mode, clear_cache), {}, retry=False)

    async def resume(self) -> dict[str, Any]:
        return await self.post_json("/resume", {})

    async def is_paused(self) -> bool:
        return bool((await self.get_json("/is_paused"))["is_paused"])

    def pause_sync(self, mode: str = "abort", *, clear_cache: bool = True, timeout_s: float | None = None) -> dict[str, Any]:
        return self.post_json_sync(self.pause_path(mode, clear_cache), {}, timeout_s=timeout_s)

    def resume_sync(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        return self.post_json_sync("/resume", {}, timeout_s=timeout_s, retry=True)

    def is_paused_sync(self, *, timeout_s: float | None = None) -> bool:
        return bool(self.get_json_sync("/is_paused", timeout_s=timeout_s)["is_paused"])

    # ---- HTTP -------------------------------------------------------------------------------
    def sync_client(self) -> httpx.Client:
        if self._sync is None:
            self._sync = httpx.Client(timeout=self.timeout_s, headers=self._headers)
        return self._sync

    def _async_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None or client.is_closed:
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
            client = self._async[loop] = httpx.AsyncClient(timeout=self.timeout_s, limits=limits, headers=self._headers)
        return client

    async def post_json(self, path: str, body: dict[str, Any], *, retry: bool = True) -> dict[str, Any]:
        send = lambda: self._async_client().post(self.base_url + path, json=body)  # noqa: E731
        return await self.retry.acall(send, path, retry, bound_s=self.timeout_s, peer=self.base_url)

    async def get_json(self, path: str) -> dict[str, Any]:
        send = lambda: self._async_client().get(self.base_url + path)  # noqa: E731
        return await self.retry.acall(send, path, bound_s=self.timeout_s, peer=self.base_url)

    def post_json_sync(
        self, path: str, body: dict[str, Any] | None = None, *, timeout_s: float | None = None, retry: bool = False
    ) -> dict[str, Any]:
        """Blocking POST (the weight control plane): ``timeout_s`` bounds the whole call."""
        bound = timeout_s if timeout_s is not None else self.timeout_s
        send = lambda left: self.sync_client().post(self.base_url + path, json=body or {}, timeout=left)  # noqa: E731
        return self.retry.call(send, path, retry, bound_s=bound, peer=self.base_url)

    def get_json_sync(self, path: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        bound = timeout_s if timeout_s is not None else self.timeout_s
        send = lambda left: self.sync_client().get(self.base_url + path, timeout=left)  # noqa: E731
        return self.retry.call(send, path, bound_s=bound, peer=self.base_url)

    # kept for callers of the earlier private names
    _post_json = post_json
    _get_json = get_json

    async def aclose(self) -> None:
        """Close this event loop's HTTP client (and the blocking one)."""
        client = self._async.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
        if self._sync is not None:
            self._sync.close()
            self._sync = None


def wire_messages(messages: list[Any]) -> list[Any]:
    """Messages in the OpenAI wire shape: tool-call ``arguments`` as JSON strings (Ludic keeps
    them as objects, which is what Hugging Face chat templates render)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [_wire_call(c) for c in m["tool_calls"]]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def _wire_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function", {})
    if isinstance(fn.get("arguments"), dict):
        return {**call, "function": {**fn, "arguments": json.dumps(fn["arguments"])}}
    return call
