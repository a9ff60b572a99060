"""An OpenAI-compatible HTTP server over the embedded engine, with weight-update endpoints.

The CPU (or single-GPU) stand-in for a vLLM server: ``VLLMChatClient`` talks to either. Run::

    python -m ludic.inference.server MODEL_DIR --host 127.0.0.1 --port 8000 [--device cpu]

Endpoints:
- ``GET /health`` and ``GET /policy_version``.
- ``GET /v1/models``.
- ``POST /v1/chat/completions``: OpenAI fields (``messages``, ``temperature``, ``top_p``,
  ``max_tokens``, ``seed``, ``stop``, ``n`` = 1, ``logprobs``) plus vLLM's ``return_token_ids``
  and Ludic's ``prompt_token_ids`` (token-in: sample from exactly these ids). The response adds
  ``prompt_token_ids``, ``choices[0].token_ids`` and ``policy_version``.
- ``POST /update_weights?version=N``: a safetensors blob of (part of) the state dict, loaded all
  or nothing; a bad blob is a 400 and the old weights keep serving.
Concurrent requests are batched by the engine (one forward per decoding step for all of them).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from aiohttp import web

from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import SamplingConfig
from ludic.inference.transformers_client import TransformersChatClient

SAMPLING_FIELDS = {"temperature": "temperature", "top_p": "top_p", "max_tokens": "max_tokens", "seed": "seed"}
ENGINE_KEY = web.AppKey("engine", TransformersChatClient)


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400 and this message."""


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def parse_chat_request(body: Any, model_name: str) -> ChatCompletionRequest:
    """The OpenAI/vLLM JSON body as a Ludic request; BadRequest names the offending field."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if body.get("n", 1) != 1:
        raise BadRequest(f"n={body['n']!r}: only n=1 is supported (send G requests for a group)")
    kwargs: dict[str, Any] = {k: body[src] for src, k in SAMPLING_FIELDS.items() if body.get(src) is not None}
    if body.get("max_completion_tokens") is not None:
        kwargs["max_tokens"] = body["max_completion_tokens"]
    if body.get("stop") is not None:
        kwargs["stop"] = body["stop"]
    try:
        sampling = SamplingConfig(**kwargs)
    except (TypeError, ValueError) as exc:
        raise BadRequest(str(exc)) from exc
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise BadRequest(f"tools must be a list of JSON objects, got {tools!r:.80}")
    try:
        return ChatCompletionRequest(
            model=str(body.get("model") or model_name),
            messages=body.get("messages") or [],
            sampling=sampling,
            prompt_token_ids=body.get("prompt_token_ids"),
            tools=tools,
        )
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"messages/prompt_token_ids: {exc}") from exc


def chat_response_json(request_body: dict[str, Any], response: Any, model_name: str) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": response.text},
        "finish_reason": response.finish_reason,
        "token_ids": response.completion_token_ids,
    }
    if request_body.get("logprobs"):
        choice["logprobs"] = {
            "content": [
                {"token": f"token_id:{t}", "logprob": lp}
                for t, lp in zip(response.completion_token_ids, response.completion_logprobs, strict=True)
            ]
        }
    prompt_n, completion_n = len(response.prompt_token_ids), len(response.completion_token_ids)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice],
        "prompt_token_ids": response.prompt_token_ids,
        "usage": {
            "prompt_tokens": prompt_n,
            "completion_tokens": completion_n,
            "total_tokens": prompt_n + completion_n,
        },
        "policy_version": response.policy_version,
    }


async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {"status": "ok", "model": engine.model_name, "policy_version": engine.policy_version}
    )


async def policy_version(request: web.Request) -> web.Response:
    return web.json_response({"policy_version": request.app[ENGINE_KEY].policy_version})


async def models(request: web.Request) -> web.Response:
    name = request.app[ENGINE_KEY].model_name
    return web.json_response(
        {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "ludic"}]}
    )


async def chat_completions(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        body = await request.json()
        chat = parse_chat_request(body, engine.model_name)
        response, _ = await engine.complete(chat)
    except ValueError as exc:  # BadRequest, or the engine's: prompt too long, ids outside the vocabulary
        return _error(400, str(exc))
    return web.json_response(chat_response_json(body, response, engine.model_name))


async def update_weights(request: web.Request) -> web.Response:
    from safetensors.torch import load

    engine = request.app[ENGINE_KEY]
    version = request.query.get("version")
    try:
        params = load(await request.read())
        version_int = int(version) if version is not None else None
        status = await asyncio.to_thread(engine.sync_weights, params, version=version_int)
    except Exception as exc:  # a bad blob or state dict: refuse it, keep serving the old weights
        return _error(400, f"weights rejected: {exc}")
    return web.json_response({"status": status, "policy_version": engine.policy_version})


def build_app(engine: TransformersChatClient) -> web.Application:
    app = web.Application(client_max_size=1 << 34)  # weight blobs are as large as the model
    app[ENGINE_KEY] = engine
    app.router.add_get("/health", health)
    app.router.add_get("/policy_version", policy_version)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/update_weights", update_weights)
    return app


def serve(
    model: str, *, host: str = "127.0.0.1", port: int = 8000, device: str = "cpu", max_batch_size: int = 64
) -> None:
    """Load ``model`` (a ``save_pretrained`` directory) and serve it until interrupted."""
    engine = TransformersChatClient(  # decode off the loop: it keeps accepting requests meanwhile
        model, device=device, max_batch_size=max_batch_size, generate_in_thread=True
    )
    web.run_app(build_app(engine), host=host, port=port, print=lambda _: None, handle_signals=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="model directory (config.json, weights, tokenizer)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    print(f"ludic inference server: {args.model} on http://{args.host}:{args.port}", flush=True)
    serve(args.model, host=args.host, port=args.port, device=args.device, max_batch_size=args.max_batch_size)


if __name__ == "__main__":
    main()
