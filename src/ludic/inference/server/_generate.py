"""The server's generation routes: OpenAI chat, completions with token-id prompts, vLLM's generate route.

Request bodies are parsed into (prompt ids, SamplingConfig) and refused with ``BadRequest`` naming
the field; responses add vLLM's ``token_ids``/``prompt_token_ids`` (``return_token_ids``) and
``weight_versions`` spans (``[{"version": "3", "start": 0, "end": n}]``: which weights produced
which output tokens), plus Ludic's ``policy_version``. A chat's assistant messages may carry the
``token_ids`` returned for them, which the prompt then holds verbatim (``inference/server/_exact_ids.py``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from aiohttp import web

from ludic.inference.embedded.transformers_client import TransformersChatClient
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import SamplingConfig
from ludic.inference.server._chat_stream import ContentStream, stream_chat
from ludic.inference.server._exact_ids import spliced_prompt_ids, split_reply_ids
from ludic.inference.server._json import BadRequest, read_json
from ludic.inference.server._tool_calls import (
    EXCLUDE_TOOLS_KEY,
    TOOL_PARSER_KEY,
    assistant_message,
    prefill_text,
    read_reply,
    tool_mode,
    unmet,
)
from ludic.inference.tool_parsers import ParsedReply
from ludic.types import ChatResponse

ENGINE_KEY = web.AppKey("engine", TransformersChatClient)
SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens", "seed", "stop")

__all__ = ["ENGINE_KEY", "BadRequest", "chat_completions", "completions", "generate"]


def parse_sampling(fields: Any) -> SamplingConfig:
    if not isinstance(fields, dict):
        raise BadRequest(f"sampling parameters must be a JSON object, got {type(fields).__name__}")
    if fields.get("n", 1) != 1:
        raise BadRequest(f"n={fields['n']!r:.40}: only n=1 is supported (send G requests for a group)")
    kwargs: dict[str, Any] = {k: fields[k] for k in SAMPLING_FIELDS if fields.get(k) is not None}
    if fields.get("max_completion_tokens") is not None:
        kwargs["max_tokens"] = fields["max_completion_tokens"]
    try:
        return SamplingConfig(**kwargs)
    except (TypeError, ValueError) as exc:
        raise BadRequest(str(exc)) from exc


def parse_token_ids(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise BadRequest(f"{field} must be a non-empty list of token ids (ints)")
    if min(value) < 0:
        raise BadRequest(f"{field} contains negative token ids")
    return value


def parse_chat_request(body: Any, model_name: str) -> ChatCompletionRequest:
    """The OpenAI/vLLM chat body as a Ludic request; BadRequest names the offending field."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    sampling = parse_sampling(body)
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


def weight_versions(info: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's spans: which policy version produced which output tokens (one span unless a ``keep``
    pause froze the request across a weight update)."""
    return info["weight_versions"]


def _token_logprobs(response: ChatResponse) -> list[dict[str, Any]]:
    ids, logps = response.completion_token_ids or [], response.completion_logprobs or []
    return [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(ids, logps, strict=True)]


def _envelope(kind: str, model: str, choice: dict[str, Any], response: ChatResponse) -> dict[str, Any]:
    prompt_n, completion_n = len(response.prompt_token_ids or []), len(response.completion_token_ids or [])
    return {
        "id": f"{kind}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "prompt_token_ids": response.prompt_token_ids,
        "usage": {"prompt_tokens": prompt_n, "completion_tokens": completion_n, "total_tokens": prompt_n + completion_n},
        "policy_version": response.policy_version,
    }


def _check_ids(engine: TransformersChatClient, ids: list[int], sampling: SamplingConfig) -> None:
    vocab = engine.model.get_input_embeddings().num_embeddings
    if max(ids) >= vocab:
        raise BadRequest(f"prompt contains ids {[t for t in ids if t >= vocab][:5]} outside the vocabulary of size {vocab}")
    engine.check_fits(len(ids), sampling.max_tokens)


async def _checked_complete(
    engine: TransformersChatClient, ids: list[int], sampling: SamplingConfig
) -> tuple[ChatResponse, dict[str, Any]]:
    _check_ids(engine, ids, sampling)
    return await engine.complete_ids(ids, sampling)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """OpenAI chat; tool calls in the reply come back as ``tool_calls`` (``inference/server/_tool_calls.py``),
    ``tool_choice`` forces one by prefilling its opening; ``stream=true`` sends tokens as they are decoded."""
    engine = request.app[ENGINE_KEY]
    body = await read_json(request)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise BadRequest(f"stream must be a boolean, got {stream!r:.40}")
    parser = request.app.get(TOOL_PARSER_KEY)
    mode = tool_mode(body, have_parser=parser is not None, exclude_when_none=request.app.get(EXCLUDE_TOOLS_KEY, False))
    if not mode.render_tools:
        body = {**body, "tools": None}
    messages, reply_ids = split_reply_ids(body.get("messages"))
    chat = parse_chat_request({**body, "messages": messages} if reply_ids else body, engine.model_name)
    engine.check_chat_fits(chat)  # microseconds; refuses a chat too long for the context before templating it
    prefill = prefill_text(parser, mode, getattr(engine.tokenizer, "chat_template", None))
    # rendering a long chat template is CPU work: keep it off the event loop
    ids, why = None, ""
    if reply_ids and chat.prompt_token_ids is None:  # replies sent back with their ids: keep them verbatim
        ids, why = await asyncio.to_thread(spliced_prompt_ids, engine.tokenizer, chat.messages, reply_ids, chat.tools)
    ids = ids or await asyncio.to_thread(engine.prompt_ids_for, chat)
    forced = list(engine.tokenizer(prefill, add_special_tokens=False)["input_ids"]) if prefill else []
    ids = ids + forced  # a forced call's opening is prompt: it was not sampled, so it is never trained as action
    _check_ids(engine, ids, chat.sampling)

    def finish(response: ChatResponse, info: dict[str, Any]) -> tuple[dict[str, Any], ParsedReply]:
        text = prefill + response.text
        parsed, finish_reason = read_reply(text, response.finish_reason, parser, mode)  # type: ignore[arg-type]
        choice: dict[str, Any] = {
            "index": 0,
            "message": assistant_message(parsed),
            "finish_reason": finish_reason,
            "token_ids": response.completion_token_ids,  # the whole sampled reply, calls included: what is trained
            "weight_versions": weight_versions(info),
        }
        if parsed.tool_calls or prefill:  # the reply as written (Ludic's extra field): the message no longer spells it
            choice["text"] = text
        if prefill:
            choice["forced_token_ids"] = forced  # the last ids of prompt_token_ids; the reply's text starts with them
            if not parsed.tool_calls:  # read_reply turned an unmet forced reply into plain content: say why
                choice["tool_choice_unmet"] = unmet(parser.parse(text), mode)  # type: ignore[union-attr]
        if body.get("logprobs"):
            choice["logprobs"] = {"content": _token_logprobs(response)}
        envelope = _envelope("chat.completion", engine.model_name, choice, response)
        if why:
            envelope["sequence_break"] = why
        return envelope, parsed

    if stream:
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        content = ContentStream(engine.reply_text, prefill, chat.sampling.stop, parser if mode.parse_calls else None)
        return await stream_chat(request, ids, lambda sink: engine.complete_ids(ids, chat.sampling, on_token=sink),
                                 content, finish, model=engine.model_name, include_usage=include_usage)  # fmt: skip
    envelope, _ = finish(*await engine.complete_ids(ids, chat.sampling))
    return web.json_response(envelope)


async def completions(request: web.Request) -> web.Response:
    """``/v1/completions`` with ``prompt`` as token ids; ``prompt_logprobs`` scores the prompt (the sync probe)."""
    engine = request.app[ENGINE_KEY]
    body = await read_json(request)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        raise BadRequest("prompt must be a list of token ids: this server never tokenises text on the training path")
    ids = parse_token_ids(prompt, "prompt")
    sampling = parse_sampling(body)
    response, info = await _checked_complete(engine, ids, sampling)
    choice: dict[str, Any] = {
        "index": 0,
        "text": response.text,
        "finish_reason": response.finish_reason,
        "token_ids": response.completion_token_ids,
        "prompt_token_ids": ids,
        "weight_versions": weight_versions(info),
    }
    if body.get("logprobs") is not None:
        choice["logprobs"] = {
            "tokens": [f"token_id:{t}" for t in response.completion_token_ids or []],
            "token_logprobs": response.completion_logprobs,
        }
    if body.get("prompt_logprobs") is not None:
        scored, _ = await asyncio.to_thread(engine.score_prompt, ids)
        choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": lp}} for t, lp in zip(ids[1:], scored, strict=True)]
    return web.json_response(_envelope("text_completion", engine.model_name, choice, response))


async def generate(request: web.Request) -> web.Response:
    """vLLM's ``/inference/v1/generate``: ``token_ids`` + ``sampling_params`` in, token ids out."""
    engine = request.app[ENGINE_KEY]
    body = await read_json(request)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    ids = parse_token_ids(body.get("token_ids"), "token_ids")
    params = body.get("sampling_params") or {}
    response, info = await _checked_complete(engine, ids, parse_sampling(params))
    choice: dict[str, Any] = {
        "index": 0,
        "token_ids": response.completion_token_ids,
        "finish_reason": response.finish_reason,
        "weight_versions": weight_versions(info),
    }
    if isinstance(params, dict) and params.get("logprobs") is not None:
        choice["logprobs"] = {"content": _token_logprobs(response)}
    return web.json_response(
        {"request_id": f"gen-{uuid.uuid4().hex}", "choices": [choice], "prompt_token_ids": ids,
         "policy_version": response.policy_version}
    )  # fmt: skip
