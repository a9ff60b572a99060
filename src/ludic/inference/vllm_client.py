"""``VLLMChatClient``: the ChatClient for an OpenAI-compatible server over HTTP.

Completions use the OpenAI chat API plus vLLM's ``return_token_ids`` and ``logprobs``, so each
response carries the exact prompt/completion ids and the sampling log-probs Ludic trains on
(token-in: a request with ``prompt_token_ids`` sends them as such). Weight updates
(``enable_weight_updates=True``) POST the state dict as one safetensors blob to
``/update_weights``, which ``python -m ludic.inference.server`` serves; NCCL pushes to a GPU vLLM
server are not built.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import torch

from ludic.inference.request import ChatCompletionRequest
from ludic.types import ChatResponse


class ServerError(RuntimeError):
    """The server answered with an error (the message is the server's)."""


class VLLMChatClient:
    """ChatClient (and VersionedClient) for a vLLM-style server at ``base_url`` or ``host:port``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8000,
        *,
        base_url: str | None = None,
        enable_weight_updates: bool = False,
        timeout_s: float = 600.0,
        max_connections: int = 256,
    ) -> None:
        self.base_url = (base_url or f"http://{host}:{port}").rstrip("/")
        parts = urlsplit(self.base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"VLLMChatClient needs an http://host:port URL, got {self.base_url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.enable_weight_updates = enable_weight_updates
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self._sessions: dict[asyncio.AbstractEventLoop, Any] = {}

    # ---- ChatClient -------------------------------------------------------------------------
    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        started = time.perf_counter()
        body = await self._post_json("/v1/chat/completions", self.request_body(request))
        response = self.parse_response(body)
        return response, {
            "latency_s": time.perf_counter() - started,
            "policy_version": response.policy_version,
        }

    @staticmethod
    def request_body(request: ChatCompletionRequest) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": request.model,
            "messages": wire_messages(request.messages),
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_tokens,
            "n": 1,
            "logprobs": True,
            "return_token_ids": True,
        }
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = list(s.stop)
        if request.prompt_token_ids is not None:
            body["prompt_token_ids"] = list(request.prompt_token_ids)
        if request.tools is not None:
            body["tools"] = request.tools
        return body

    @staticmethod
    def parse_response(body: dict[str, Any]) -> ChatResponse:
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
            text=choice["message"].get("content") or "",
            finish_reason=choice.get("finish_reason"),
            prompt_token_ids=[int(t) for t in prompt_ids],
            completion_token_ids=[int(t) for t in ids],
            completion_logprobs=[float(c["logprob"]) for c in content],
            policy_version=body.get("policy_version"),
            tool_calls=choice["message"].get("tool_calls") or None,
        )

    async def get_policy_version(self) -> int:
        return int((await self._get_json("/policy_version"))["policy_version"])

    def sync_weights(
        self,
        params: Mapping[str, torch.Tensor],
        *,
        timeout_s: float = 600.0,
        version: int | None = None,
    ) -> str:
        """POST the weights as safetensors; blocking (the Trainer publishes from sync code)."""
        from safetensors.torch import save

        if not self.enable_weight_updates:
            raise RuntimeError("VLLMChatClient(enable_weight_updates=False) cannot sync weights")
        blob = save(_unshared_cpu(params))
        path = "/update_weights" + (f"?version={int(version)}" if version is not None else "")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        try:
            conn.request("POST", path, body=blob, headers={"Content-Type": "application/octet-stream"})
            reply = conn.getresponse()
            payload = _checked(reply.status, json.loads(reply.read() or b"{}"), path)
        finally:
            conn.close()
        return str(payload.get("status"))

    # ---- HTTP -------------------------------------------------------------------------------
    def _session(self) -> Any:
        import aiohttp

        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections)
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            session = self._sessions[loop] = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return session

    async def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self._session().post(self.base_url + path, json=body) as reply:
            return await self._json(reply, path)

    async def _get_json(self, path: str) -> dict[str, Any]:
        async with self._session().get(self.base_url + path) as reply:
            return await self._json(reply, path)

    @staticmethod
    async def _json(reply: Any, path: str) -> dict[str, Any]:
        return _checked(reply.status, await reply.json(content_type=None), path)

    async def aclose(self) -> None:
        """Close this event loop's HTTP session."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()


def _checked(status: int, payload: dict[str, Any], path: str) -> dict[str, Any]:
    """``payload`` of a 200; a 400 (the request was refused) is a ValueError, anything else a ServerError."""
    if status == 400:
        raise ValueError(f"{path}: {payload.get('error', {}).get('message', payload)}")
    if status != 200:
        raise ServerError(f"{path} -> HTTP {status}: {payload}")
    return payload


def _unshared_cpu(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU tensors safetensors can write: tied weights (embeddings = lm_head) get their own copy."""
    out, seen = {}, set()
    for name, tensor in params.items():
        t = tensor.detach().contiguous().cpu()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


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
