"""``--dry-run``'s look at an OpenAI-SDK program's prompt (the ``openai_program`` protocol kind).

A program builds its own messages and tools, so the plain harness's prompt-length check does not see them:
a system prompt or a tools block that fills ``[trainer].max_seq_len`` used to fail at the first step. Here
the program runs once on the env's first observation with the real ``openai`` client, its HTTP transport
capturing the first chat request and answering nothing (no model, no server); that request's messages and
tools are rendered with the chat template and measured. A program that makes no request before it fails,
or none within :data:`PROBE_TIMEOUT_S`, is left to the run.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ludic.config import RunConfig

PROBE_TIMEOUT_S = 20.0
"""How long the dry run waits for the program's first request."""


class _Captured(Exception):
    """Raised by the capturing transport: the program's first request was taken, nothing is answered."""


class _Capture:
    """The first chat request's JSON body; every request is answered by raising (no server is involved)."""

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None

    def take(self, request: Any) -> None:
        if self.body is None and request.url.path.endswith("/chat/completions"):
            try:
                self.body = json.loads(request.content or b"{}")
            except ValueError:
                self.body = None
        raise _Captured("ludic --dry-run: the request was captured, not sent")


def first_request(program: Callable[..., Any], task: Any) -> dict[str, Any] | None:
    """The body of the program's first ``chat.completions`` request on ``task``, or None if it made none
    (within :data:`PROBE_TIMEOUT_S`). The program runs on a daemon thread of its own: one that hangs after
    its request is left behind, as the protocol leaves a program past its timeout."""
    import httpx
    import openai

    from ludic.interaction.openai_program import _is_async

    capture, settled = _Capture(), threading.Event()
    kwargs = {"base_url": "http://ludic-dry-run.invalid/v1", "api_key": "EMPTY", "max_retries": 0}

    class AsyncTake(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            await request.aread()
            try:
                capture.take(request)
            finally:
                settled.set()
            raise AssertionError("unreachable")

    class SyncTake(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            request.read()
            try:
                capture.take(request)
            finally:
                settled.set()
            raise AssertionError("unreachable")

    async def run_async() -> None:
        async with openai.AsyncOpenAI(http_client=httpx.AsyncClient(transport=AsyncTake()), **kwargs) as client:
            await program(client, task)

    def run() -> None:
        try:
            if _is_async(program):
                asyncio.run(run_async())
            else:
                with openai.OpenAI(http_client=httpx.Client(transport=SyncTake()), **kwargs) as client:
                    program(client, task)
        except BaseException:  # the program fails without an answer: expected; its request is what counts
            pass
        finally:
            settled.set()

    threading.Thread(target=run, name="ludic-dry-run-program", daemon=True).start()
    settled.wait(PROBE_TIMEOUT_S)
    return capture.body


def program_prompt_errors(cfg: RunConfig, env_factory: Callable[..., Any], protocol: Any) -> list[str]:
    """An ``openai_program`` run's first request must leave ``[trainer].max_seq_len`` room for a reply."""
    from ludic.registry.openai_program import openai_program_protocol, resolve_program

    if protocol is not openai_program_protocol or not Path(cfg.model.tokenizer or cfg.model.path).is_dir():
        return []  # another protocol, or a hub model not fetched for this check
    target = cfg.protocol.kwargs.get("program")
    try:
        program = resolve_program(target)
        env = env_factory(**cfg.env.kwargs)
        (obs, info), *_ = env.reset(seed=cfg.rollout.seed).values()
    except Exception:
        return []  # reported by the other checks (the program's import, the env's kwargs)
    from ludic.interaction.openai_program import ProgramTask

    task = ProgramTask(str(obs), env.suggested_sysprompt, "ludic", dict(info), cfg.rollout.seed)
    body = first_request(program, task)
    if not body or not isinstance(body.get("messages"), list):
        return []
    from transformers import AutoTokenizer

    from ludic.inference.template_ids import chat_template_ids

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer or cfg.model.path)
    if not getattr(tokenizer, "chat_template", None):
        return []
    tools = body.get("tools") or None
    n = len(chat_template_ids(tokenizer, body["messages"], tools=tools))
    if n < cfg.trainer.max_seq_len:
        return []
    parts = f"{len(body['messages'])} messages" + (f" and {len(tools)} tools" if tools else "")
    return [
        f"[trainer].max_seq_len: {cfg.trainer.max_seq_len} leaves no reply token: program {target!r}'s first "
        f"request on env {cfg.env.name!r} (seed {cfg.rollout.seed}; {parts}, rendered with the chat template) "
        f"is already {n} tokens, so every reply would be truncated away and nothing learned; raise max_seq_len"
    ]
