"""The server's weight routes: vLLM's weight-transfer protocol, and Ludic's one-blob upload.

vLLM's routes (``VLLM_SERVER_DEV_MODE=1``): ``POST /init_weight_transfer_engine {"init_info"}``,
``POST /start_weight_update``, ``POST /update_weights {"update_info"}`` (receives the tensors the
trainer broadcasts meanwhile), ``POST /finish_weight_update {"weight_version"}``, ``GET
/get_world_size``, ``GET /weight_info``, and ``POST /pause?mode=abort|wait|keep``, ``POST /resume``,
``GET /is_paused`` (``ludic.inference.weight_sync.pause``). The data plane work runs on worker threads so
generation keeps being served. ``POST /ludic/update_weights_blob?version=N`` takes a safetensors blob instead
(no collective needed), bounded by the model's own size. Ludic's same-host data plane (``init_info
{"backend": "shm"}``, ``ludic.inference.weight_sync.shared_memory``) adds ``POST /ludic/reserve_weight_buffer
{"update_info"}``: a shared buffer for the trainer to write that call's tensors into.

``/start_weight_update`` answers an ``update_id``; the other calls of that update may send it (the
shared-memory ones must), and ``POST /ludic/abort_weight_update {"update_id"}`` discards it. ``POST /ludic/declare_restore {"version"}`` lets
the next update go back to that version (a trainer resumed from an older checkpoint). While one
publisher's update is in progress, another's ``start`` or ``init`` is refused with 409, and so are
``/ludic/update_weights_blob``, ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (they would change
the weights under that update). Ludic's own
fields save two round trips: ``/start_weight_update {"pause": mode}`` pauses first and
``/finish_weight_update {"resume": true}`` resumes after (a refused update too).
"""

from __future__ import annotations

import asyncio
import dataclasses
from functools import partial
from typing import Any

from aiohttp import web

from ludic.inference.server._generate import ENGINE_KEY, BadRequest
from ludic.inference.server._json import read_json
from ludic.inference.server._origin_guard import require_content_type
from ludic.inference.weight_sync._update_owner import UpdateConflict
from ludic.inference.weight_sync.adapter_config import AdapterPayload, blob_metadata, metadata_adapter_config
from ludic.inference.weight_sync.pause import PAUSE_MODES
from ludic.inference.weight_sync.receiver import InitInfo, WeightReceiver, parse_init_info
from ludic.inference.weight_sync.shared_memory import SHARED_MEMORY_BACKEND
from ludic.inference.weight_sync.tied_names import read_aliases, with_aliases
from ludic.inference.weight_sync.weights import weight_info as model_weight_info

RECEIVER_KEY = web.AppKey("receiver", WeightReceiver)


async def _in_thread(fn: Any, *args: Any) -> Any:
    """``fn`` on a worker thread; another publisher's update in progress is a 409 naming it."""
    try:
        return await asyncio.to_thread(fn, *args)
    except UpdateConflict as exc:
        raise web.HTTPConflict(text=str(exc)) from exc


def _unless_updating(receiver: WeightReceiver, action: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` unless another publisher's update is in progress (``UpdateConflict``, a 409): a
    blob or adapter folder applied meanwhile would land under that update's tensors."""
    receiver.owner.refuse_if_busy(action)
    return fn(*args, **kwargs)


async def _json_body(request: web.Request) -> dict[str, Any]:
    if request.can_read_body:  # a page may send text/plain cross-origin with no preflight: JSON only
        require_content_type(request, "application/json")
    body = await read_json(request)  # bounded, finite, not too deep (else a 4xx)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


async def _json_field(request: web.Request, field: str) -> Any:
    return (await _json_body(request)).get(field)


async def init_weight_transfer_engine(request: web.Request) -> web.Response:
    info = parse_init_info(await _json_field(request, "init_info"))
    await _in_thread(request.app[RECEIVER_KEY].init, info)
    if not isinstance(info, InitInfo):
        return web.json_response({"status": "ok", "backend": SHARED_MEMORY_BACKEND})
    return web.json_response({"status": "ok", "rank": info.rank_offset, "world_size": info.world_size})


async def reserve_weight_buffer(request: web.Request) -> web.Response:
    """Ludic's shared-memory data plane: where the trainer writes this ``update_info``'s packed tensors."""
    body = await _json_body(request)
    receiver = request.app[RECEIVER_KEY]
    return web.json_response(await _in_thread(receiver.reserve, body.get("update_info"), body.get("update_id")))


async def start_weight_update(request: web.Request) -> web.Response:
    """vLLM's route; Ludic's optional ``{"adapter": config}`` makes the update a LoRA adapter's, and
    ``{"pause": mode}`` pauses first (``/pause?mode=``; one round trip less; resumed if the start fails)."""
    body = await _json_body(request) if request.can_read_body else {}
    pause_mode = body.get("pause")
    if pause_mode is not None:
        if pause_mode not in PAUSE_MODES:
            raise BadRequest(f"unknown pause mode {pause_mode!r}: pause must be one of {list(PAUSE_MODES)}")
        await request.app[ENGINE_KEY].pause(pause_mode)
    try:
        update_id = await _in_thread(request.app[RECEIVER_KEY].start, body.get("adapter"))
    except BaseException:
        if pause_mode is not None:
            request.app[ENGINE_KEY].resume()
        raise
    return web.json_response({"status": "ok", "update_id": update_id, "paused": pause_mode})


async def abort_weight_update(request: web.Request) -> web.Response:
    await _in_thread(request.app[RECEIVER_KEY].abort, await _json_field(request, "update_id"))
    return web.json_response({"status": "aborted"})


async def update_weights(request: web.Request) -> web.Response:
    """vLLM's meaning: receive the tensors named in ``update_info`` over the collective."""
    body = await _json_body(request)
    count = await _in_thread(request.app[RECEIVER_KEY].receive, body.get("update_info"), body.get("update_id"))
    return web.json_response({"status": "ok", "received": count})


async def finish_weight_update(request: web.Request) -> web.Response:
    """vLLM's route; Ludic's optional ``{"resume": true}`` resumes after it, applied or refused (``/resume``), and
    ``{"aliases": {name: name sent}}`` gives tied names sent once the tensor they share."""
    body = await _json_body(request)
    receiver, engine = request.app[RECEIVER_KEY], request.app[ENGINE_KEY]
    resume = body.get("resume") is True
    try:
        status = await _in_thread(receiver.finish, body.get("weight_version"), body.get("update_id"), body.get("aliases"))
    finally:
        if resume:
            engine.resume()
    return web.json_response({"status": status, "policy_version": engine.policy_version, "resumed": resume,
                              "timings": receiver.timings})  # timings: this update's stages here, in seconds


async def get_world_size(request: web.Request) -> web.Response:
    return web.json_response({"world_size": 1})  # one inference rank: this process


async def weight_info(request: web.Request) -> web.Response:
    return web.json_response(model_weight_info(request.app[ENGINE_KEY].model))


def _query_bool(request: web.Request, name: str, default: bool) -> bool:
    value = request.query.get(name)
    if value is None:
        return default
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise BadRequest(f"query parameter {name} must be true or false, got {value!r}")


async def pause(request: web.Request) -> web.Response:
    """vLLM's ``/pause``: ``mode`` (abort, the default | wait | keep), ``wait_for_inflight_requests``
    (deprecated: true means mode=wait), ``clear_cache`` (this engine keeps no KV or prefix cache
    between requests, so after abort or wait there is nothing left to clear; vLLM ignores it for keep)."""
    mode = request.query.get("mode", "abort")
    if mode not in PAUSE_MODES:
        raise BadRequest(f"unknown pause mode {mode!r}: mode must be one of {list(PAUSE_MODES)}")
    if _query_bool(request, "wait_for_inflight_requests", False):
        mode = "wait"
    _query_bool(request, "clear_cache", True)  # checked for the caller's sake; see the docstring
    in_flight = await request.app[ENGINE_KEY].pause(mode)
    return web.json_response({"status": "paused", "mode": mode, "in_flight": in_flight})


async def resume(request: web.Request) -> web.Response:
    request.app[ENGINE_KEY].resume()
    return web.json_response({"status": "resumed"})


async def is_paused(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response({"is_paused": engine.gate.paused, **engine.load()})


def max_blob_bytes(engine: Any) -> int:
    """A full-model blob plus safetensors' header room (names, offsets)."""
    state = engine.model.state_dict()
    return sum(t.numel() * 8 for t in state.values()) + 64 * len(state) + (1 << 20)


async def update_weights_blob(request: web.Request) -> web.Response:
    from safetensors.torch import load

    engine, receiver = request.app[ENGINE_KEY], request.app[RECEIVER_KEY]
    require_content_type(request, "application/octet-stream")  # what VLLMChatClient sends; never a page's
    await _in_thread(receiver.owner.refuse_if_busy, "apply a weight blob")  # before the bytes, and again below
    version = request.query.get("version")
    version_int = None if version is None else engine.next_version_for(version)  # before the bytes
    limit = max_blob_bytes(engine)
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(1 << 20):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
    blob = b"".join(chunks)  # one copy of the body (a bytearray grown, then bytes() of it, took two)
    del chunks
    try:
        metadata = blob_metadata(blob)
        params = with_aliases(load(blob), read_aliases(metadata))  # tied names sent once
        adapter = metadata_adapter_config(metadata)
        if adapter is not None:
            params = AdapterPayload(params, adapter)  # served on top of the base (``sync_adapter``)
    except Exception as exc:  # safetensors refuses a malformed blob; it never runs code
        raise BadRequest(f"weights rejected: {exc}") from exc
    try:
        apply = partial(_unless_updating, receiver, "apply a weight blob", engine.sync_weights, params, version=version_int)
        status = await _in_thread(apply)  # 409 (not 400) when another publisher's update is in progress
    except (KeyError, TypeError, ValueError) as exc:
        raise BadRequest(f"weights rejected: {exc}") from exc
    return web.json_response({"status": status, "policy_version": engine.policy_version})


async def load_lora_adapter(request: web.Request) -> web.Response:
    """vLLM's ``/v1/load_lora_adapter {lora_name, lora_path, load_inplace}``: serve the adapter folder at
    ``lora_path`` (``ludic.inference.weight_sync.adapter_files``; the weight version is the one written in it). One
    adapter at a time, applied to every request whatever its ``model``; a refused one changes nothing."""
    from ludic.inference.weight_sync.adapter_files import read_adapter_folder

    body = await _json_body(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise BadRequest("load_lora_adapter needs string fields lora_name and lora_path")
    engine = request.app[ENGINE_KEY]
    await _in_thread(request.app[RECEIVER_KEY].owner.refuse_if_busy, "load a LoRA adapter")
    try:
        payload, version = await asyncio.to_thread(partial(read_adapter_folder, path, max_bytes=max_blob_bytes(engine)))
    except Exception as exc:  # a missing or malformed folder: the caller's mistake, named
        raise BadRequest(f"lora_path {path!r} refused: {exc}") from exc
    payload = AdapterPayload(payload, dataclasses.replace(payload.config, name=name))  # unloaded by this name
    receiver = request.app[RECEIVER_KEY]
    await _in_thread(partial(_unless_updating, receiver, "load a LoRA adapter", engine.sync_adapter, payload, version=version))
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    """vLLM's ``/v1/unload_lora_adapter {lora_name}``: the base serves again (the version is kept); 404 unless
    the adapter served has that name (its ``lora_name``, or over the other routes its peft name)."""
    name = await _json_field(request, "lora_name")
    engine = request.app[ENGINE_KEY]
    unload = partial(_unless_updating, request.app[RECEIVER_KEY], "unload a LoRA adapter", engine.unload_adapter, name=name)
    if not isinstance(name, str) or not await _in_thread(unload):
        current = engine.adapter.config
        serving = f" (serving {current.name!r})" if current is not None else ""
        raise web.HTTPNotFound(text=f"no LoRA adapter named {name!r} is loaded{serving}")
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


async def declare_restore(request: web.Request) -> web.Response:
    """Ludic's ``POST /ludic/declare_restore {"version": N}``: the next weight update may carry version N though
    the server serves a later one (a trainer resumed from an older checkpoint: ``EngineWeightsMixin.declare_restore``)."""
    body = await _json_body(request)
    engine = request.app[ENGINE_KEY]
    try:
        version = engine.declare_restore(body.get("version"))
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    return web.json_response({"status": "ok", "restore_to": version, "policy_version": engine.policy_version})


def add_weight_routes(app: web.Application) -> None:
    app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
    app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
    app.router.add_post("/init_weight_transfer_engine", init_weight_transfer_engine)
    app.router.add_post("/start_weight_update", start_weight_update)
    app.router.add_post("/update_weights", update_weights)
    app.router.add_post("/finish_weight_update", finish_weight_update)
    app.router.add_get("/get_world_size", get_world_size)
    app.router.add_get("/weight_info", weight_info)
    app.router.add_post("/ludic/update_weights_blob", update_weights_blob)
    app.router.add_post("/ludic/reserve_weight_buffer", reserve_weight_buffer)
    app.router.add_post("/ludic/abort_weight_update", abort_weight_update)
    app.router.add_post("/ludic/declare_restore", declare_restore)
    app.router.add_post("/pause", pause)
    app.router.add_post("/resume", resume)
    app.router.add_get("/is_paused", is_paused)
