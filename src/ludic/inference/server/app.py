"""An HTTP server over the embedded engine that speaks vLLM's RL protocol. The CPU (or one-GPU) stand-in for
``vllm serve``: ``VLLMChatClient`` and ``BroadcastPolicyPublisher`` talk to either. Run::

    python -m ludic.inference.server MODEL_DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY]

Routes:
- ``GET /health``, ``GET /policy_version``, ``GET /v1/models``.
- Generation (``inference/server/_generate.py``): ``POST /v1/chat/completions``, ``POST /v1/completions``
  (``prompt`` as token ids, ``return_token_ids``, ``logprobs``, ``prompt_logprobs``), ``POST
  /inference/v1/generate`` (``token_ids`` + ``sampling_params``). Responses carry
  ``weight_versions`` and ``policy_version``. Chat replies holding tool calls in the chat template's
  format come back as OpenAI ``tool_calls``, streamed (``stream=true``) or not (``--tool-parser``,
  ``inference/server/_tool_calls.py``).
- Weights (``inference/server/_weights.py``): vLLM's weight-transfer routes over a gloo/NCCL group, and
  ``POST /ludic/update_weights_blob?version=N`` (a safetensors blob).

Safety: binds 127.0.0.1 unless told otherwise; with ``--api-key`` (or ``$LUDIC_API_KEY``) every
route but ``/health`` needs ``Authorization: Bearer KEY`` (else 401); JSON bodies are bounded
(``--max-body-mb``, 8 by default, checked from ``Content-Length`` before reading: 413), nested at
most 64 deep, with finite numbers only (400, ``inference/server/_json.py``); more than ``--max-pending`` queued requests get a 503 with the reason. A bad request is a
4xx with the reason, an internal failure a 500; both as ``{"error": {"message", "code"}}``.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
from collections.abc import Awaitable, Callable

from aiohttp import web
from jinja2 import TemplateError

from ludic.inference.embedded.adapters import ADAPTER_SERVING
from ludic.inference.embedded.transformers_client import DTYPES, EngineOverloaded, TransformersChatClient
from ludic.inference.server._generate import ENGINE_KEY, chat_completions, completions, generate
from ludic.inference.server._json import MAX_BODY_KEY
from ludic.inference.server._origin_guard import origin_guard
from ludic.inference.server._tool_calls import EXCLUDE_TOOLS_KEY, TOOL_PARSER_KEY
from ludic.inference.server._weights import RECEIVER_KEY, add_weight_routes
from ludic.inference.tool_parsers import ToolParser, resolve_tool_parser
from ludic.inference.weight_sync.receiver import TransferError, WeightReceiver

API_KEY_KEY = web.AppKey("api_key", str)
OPEN_PATHS = frozenset({"/health"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, message: str) -> web.Response:
    if len(message) > 1000:  # a refusal may quote the input: never echo megabytes back
        message = message[:1000] + f"... ({len(message)} characters)"
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    key = request.app[API_KEY_KEY]
    if key and request.path not in OPEN_PATHS:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            return error_response(401, "missing or wrong bearer token (Authorization: Bearer <api key>)")
    return await handler(request)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Keep each error's class: refused input 4xx with the reason, overload 503, anything else 500."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.text or exc.reason)
    except json.JSONDecodeError as exc:
        return error_response(400, f"request body is not valid JSON: {exc}")
    except TemplateError as exc:  # the chat template cannot render these messages (a malformed tool call)
        return error_response(400, f"the chat template cannot render the messages: {type(exc).__name__}: {exc}")
    except (ValueError, KeyError, TypeError) as exc:  # BadRequest, the engine's refusals, bad metadata
        return error_response(400, str(exc).strip("'\""))
    except EngineOverloaded as exc:
        return error_response(503, str(exc))
    except TransferError as exc:
        return error_response(504, str(exc))
    except Exception as exc:
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response({"status": "ok", "model": engine.model_name, "policy_version": engine.policy_version})


async def policy_version(request: web.Request) -> web.Response:
    return web.json_response({"policy_version": request.app[ENGINE_KEY].policy_version})


async def models(request: web.Request) -> web.Response:
    name = request.app[ENGINE_KEY].model_name
    return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "owned_by": "ludic"}]})


def build_app(
    engine: TransformersChatClient,
    *,
    api_key: str | None = None,
    max_body_bytes: int = 8 << 20,
    transfer_timeout_s: float = 120.0,
    drop_weight_updates: bool = False,
    tool_parser: ToolParser | None = None,
    exclude_tools_when_tool_choice_none: bool = False,
) -> web.Application:
    """The aiohttp app; ``drop_weight_updates`` is fault injection (tests of the sync probe); ``tool_parser``
    reads tool calls out of chat replies (``None``: replies stay text)."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[error_middleware, auth_middleware, origin_guard])
    app[ENGINE_KEY] = engine
    app[API_KEY_KEY] = api_key or ""
    app[MAX_BODY_KEY] = max_body_bytes
    app[TOOL_PARSER_KEY] = tool_parser
    app[EXCLUDE_TOOLS_KEY] = exclude_tools_when_tool_choice_none
    app[RECEIVER_KEY] = WeightReceiver(engine, timeout_s=transfer_timeout_s, drop_updates=drop_weight_updates)
    app.router.add_get("/health", health)
    app.router.add_get("/policy_version", policy_version)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/inference/v1/generate", generate)
    add_weight_routes(app)
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="model directory (config.json, weights, tokenizer)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", choices=sorted(DTYPES))
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-pending", type=int, default=4096, help="queued requests before 503s")
    parser.add_argument("--max-body-mb", type=float, default=8.0,
                        help="largest JSON body, checked from Content-Length before reading (413 beyond)")
    parser.add_argument("--api-key", default=os.environ.get("LUDIC_API_KEY"),
                        help="bearer token required on every route but /health (default $LUDIC_API_KEY)")
    parser.add_argument("--transfer-timeout", type=float, default=120.0, help="seconds a broadcast may take")
    parser.add_argument("--adapter-serving", default="fold", choices=ADAPTER_SERVING,
                        help="serve a LoRA adapter folded into the weights (cheaper forward) or unmerged beside "
                             "them (cheaper publish); see docs/lora.md")  # fmt: skip
    parser.add_argument("--tool-parser", default="auto",
                        help="read tool calls out of chat replies as OpenAI tool_calls: auto (detected from the "
                             "chat template), none, hermes, llama3_json, mistral, or module:attr (a parser of "
                             "your own); see docs/serving.md")  # fmt: skip
    parser.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                        help="with tool_choice='none', leave the tools out of the prompt (default: rendered, "
                             "as vLLM does)")  # fmt: skip
    parser.add_argument("--drop-weight-updates", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    engine = TransformersChatClient(  # decode off the loop: it keeps accepting requests meanwhile
        args.model, device=args.device, dtype=args.dtype, max_batch_size=args.max_batch_size,
        max_pending=args.max_pending, generate_in_thread=True, adapter_serving=args.adapter_serving,
    )
    try:
        tool_parser, tool_line = resolve_tool_parser(args.tool_parser, getattr(engine.tokenizer, "chat_template", None))
    except ValueError as exc:
        raise SystemExit(f"--tool-parser: {exc}") from None
    app = build_app(engine, api_key=args.api_key, max_body_bytes=int(args.max_body_mb * (1 << 20)),
                    transfer_timeout_s=args.transfer_timeout, drop_weight_updates=args.drop_weight_updates,
                    tool_parser=tool_parser,
                    exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none)  # fmt: skip
    auth = "bearer token required" if args.api_key else "no token"
    print(f"ludic inference server: {args.model} on http://{args.host}:{args.port} ({auth}); {tool_line}", flush=True)
    # handler_cancellation: a client that disconnects cancels its handler, and so its queued row
    web.run_app(app, host=args.host, port=args.port, print=lambda _: None, handle_signals=True,
                handler_cancellation=True, shutdown_timeout=2.0)  # fmt: skip


if __name__ == "__main__":
    main()
