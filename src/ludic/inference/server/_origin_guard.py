"""Refusing what a web page could make a browser send to the server (cross-site request forgery).

Without ``--api-key`` any page a user opens may POST to ``http://127.0.0.1:8000``: a "simple" request
(``text/plain``, a form, or no body) goes out with no CORS preflight, so the server would act on it even
though the page cannot read the reply (pause generation, point the weight transfer at the attacker's
address, upload weights). Browsers mark every such request with an ``Origin`` header, which non-browser
clients (the trainer, ``curl``, the openai SDK) do not send, so the server refuses any state-changing
request carrying an ``Origin`` that is not explicitly allowed (none is by default: this server serves no
pages). Routes that take a body also require a non-simple ``Content-Type`` (``_weights``), which
a page cannot set without a preflight that this server never approves.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from aiohttp import web

ALLOWED_ORIGINS_KEY = web.AppKey("allowed_origins", frozenset)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _refusal(message: str) -> web.Response:
    return web.Response(status=403, text=json.dumps({"error": {"message": message, "code": 403}}),
                        content_type="application/json")  # fmt: skip


@web.middleware
async def origin_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """403 for a state-changing request from a browser page whose origin is not allowed."""
    origin = request.headers.get("Origin")
    allowed = request.app.get(ALLOWED_ORIGINS_KEY, frozenset())
    if request.method not in SAFE_METHODS and origin is not None and origin not in allowed:
        return _refusal(
            f"cross-origin {request.method} {request.path} from Origin {origin!r} refused: this server takes "
            "no requests from web pages (clients other than browsers send no Origin header)"
        )
    return await handler(request)


def require_content_type(request: web.Request, *allowed: str) -> None:
    """415 unless the body's Content-Type is one of ``allowed`` (never a type a page may send cross-origin
    without a preflight: ``text/plain``, ``application/x-www-form-urlencoded``, ``multipart/form-data``)."""
    given = request.headers.get("Content-Type")  # the header itself: aiohttp's default for none is octet-stream
    media = None if given is None else given.split(";", 1)[0].strip().lower()
    if media not in allowed:
        raise web.HTTPUnsupportedMediaType(
            text=f"{request.path} takes Content-Type {' or '.join(allowed)}, got {given!r}"
        )
