"""JSON request bodies for the server's routes, bounded before they cost anything.

A body larger than the server's limit is refused from its ``Content-Length`` before a byte is read
(413; a chunked body stops at the limit while being read). Parsing refuses what Python's ``json``
would accept but nothing downstream can use: ``NaN``/``Infinity`` and numbers that overflow a float
(``1e999``), and nesting deeper than ``MAX_JSON_DEPTH``. Each refusal is a 4xx naming the problem,
never a 500.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from aiohttp import web

MAX_BODY_KEY = web.AppKey("max_body_bytes", int)
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays/objects a request body may have (tool JSON schemas stay well inside it)."""
OFF_LOOP_BYTES = 256 << 10
"""Bodies larger than this are parsed on a worker thread."""


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400 and this message."""


def body_too_large(size: int, limit: int) -> web.HTTPRequestEntityTooLarge:
    text = f"request body of {size} bytes exceeds the server's limit of {limit} bytes (raise it with --max-body-mb)"
    return web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size, text=text)


async def read_json(request: web.Request) -> Any:
    """The request's JSON body (``{}`` when it has none), checked as the module docstring says."""
    limit = request.app[MAX_BODY_KEY]
    if request.content_length is not None and request.content_length > limit:
        raise body_too_large(request.content_length, limit)
    if not request.can_read_body:
        return {}
    raw = await request.read()  # aiohttp stops a chunked body at client_max_size (413)
    if len(raw) > limit:
        raise body_too_large(len(raw), limit)
    if len(raw) > OFF_LOOP_BYTES:  # megabytes take tens of milliseconds to parse: not on the event loop
        return await asyncio.to_thread(parse_json, raw)
    return parse_json(raw)


def parse_json(raw: bytes) -> Any:
    """``json.loads`` refusing non-finite numbers and deep nesting with a ``BadRequest`` that says which."""
    try:
        value = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise BadRequest(f"request body is nested too deeply: at most {MAX_JSON_DEPTH} levels of arrays/objects") from None
    except BadRequest:
        raise
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, an int of more than 4300 digits
        raise BadRequest(f"request body is not valid JSON: {str(exc)[:200]}") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:  # else it cannot nest that deep: skip the walk
        _check_depth(value)
    return value


def _refuse_constant(name: str) -> Any:
    raise BadRequest(f"request body contains {name}: JSON numbers must be finite")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadRequest(f"request body contains the number {text[:40]}, which overflows a float: numbers must be finite")
    return value


def _check_depth(value: Any) -> None:
    """Iterative (a recursive walk is what deep nesting breaks); only containers are visited."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise BadRequest(f"request body is nested too deeply: at most {MAX_JSON_DEPTH} levels of arrays/objects")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
