"""``ludic serve CONFIG --host ADDR [--port P]``: one inference-server host of a multi-host run.

Serves ``[model]`` (prepared as ``ludic train`` prepares it: a GGUF file or a catalogue name becomes a
model folder first; ``[model].tokenizer``, ``dtype`` and ``device`` as the run uses them) with Ludic's HTTP
server (``ludic.inference.server``: vLLM's routes, the weight-update routes the trainer publishes to). The
bearer token comes from the variable ``[cluster].api_key_env`` names, never from a file or the command
line. Without a token the server only binds a loopback address: every state-changing route (weight
updates, pause) would otherwise be open to the network.
"""

from __future__ import annotations

import ipaddress
import os

from ludic.config import ConfigError, RunConfig


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1); anything else reaches other hosts."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def serve_api_key(cfg: RunConfig, host: str) -> str | None:
    """The token from ``[cluster].api_key_env`` (``LUDIC_API_KEY`` without ``[cluster]``); a ConfigError when
    there is none and ``host`` is not loopback."""
    env = cfg.cluster.api_key_env if cfg.cluster is not None else "LUDIC_API_KEY"
    key = os.environ.get(env) or None
    if key is None and not is_loopback(host):
        raise ConfigError([
            f"ludic serve --host {host}: refusing to serve on a non-loopback address without a token; "
            f"export the bearer token in ${env} (the variable [cluster].api_key_env names) on this host and "
            "give the trainer and actors the same one"
        ])  # fmt: skip
    return key


def serve(cfg: RunConfig, *, host: str, port: int, max_batch_size: int = 64, max_pending: int = 4096) -> None:
    """Load ``[model]`` and serve it until SIGTERM / Ctrl-C (blocks)."""
    if not 0 < port < 65536:
        raise ConfigError([f"--port must be in 1..65535, got {port}"])
    key = serve_api_key(cfg, host)  # before loading anything
    from aiohttp import web

    from ludic.inference.embedded.transformers_client import TransformersChatClient
    from ludic.inference.server.app import build_app
    from ludic.inference.tool_parsers import resolve_tool_parser

    engine = TransformersChatClient(  # decode off the loop, as python -m ludic.inference.server does
        cfg.model.path, cfg.model.tokenizer, device=cfg.model.device, dtype=cfg.model.dtype,
        max_batch_size=max_batch_size, max_pending=max_pending, generate_in_thread=True,
        adapter_serving=cfg.lora.serving if cfg.lora is not None else "fold",
    )  # fmt: skip
    tool_parser, tool_line = resolve_tool_parser("auto", getattr(engine.tokenizer, "chat_template", None))
    app = build_app(engine, api_key=key, tool_parser=tool_parser, transfer_timeout_s=cfg.timeouts.publish_s)
    auth = "bearer token required" if key else "no token (loopback only)"
    print(f"ludic serve: {cfg.model.path} on http://{host}:{port} ({auth}); {tool_line}", flush=True)
    web.run_app(app, host=host, port=port, print=lambda _: None, handle_signals=True,
                handler_cancellation=True, shutdown_timeout=2.0)  # fmt: skip
