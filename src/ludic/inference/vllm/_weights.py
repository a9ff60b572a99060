"""``VLLMChatClient``'s weight calls: Ludic's one-blob upload, and vLLM's LoRA adapter routes.

``sync_weights`` uploads one safetensors blob to Ludic's ``/ludic/update_weights_blob`` (an
``AdapterPayload`` with its config in the blob's metadata). ``load_lora_adapter_sync`` /
``unload_lora_adapter_sync`` speak vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``
(``vllm serve --enable-lora`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; Ludic's server has them too).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import torch

from ludic.inference.http_client import RequestRefused, RetryPolicy, ServerError, server_message
from ludic.inference.weight_sync.adapter_config import ADAPTER_METADATA_KEY
from ludic.inference.weight_sync.tied_names import aliases_metadata, sendable_once

# The size of the pieces a weight blob is uploaded in (see ``in_pieces``).
UPLOAD_PIECE_BYTES = 4 << 20


class VLLMWeightsMixin:
    """Needs ``base_url``, ``timeout_s``, ``enable_weight_updates``, ``retry``, ``_headers`` and ``sync_client()``."""

    base_url: str
    timeout_s: float
    enable_weight_updates: bool
    retry: RetryPolicy
    _headers: dict[str, str]

    def sync_client(self) -> httpx.Client: ...

    def sync_weights(
        self, params: Mapping[str, torch.Tensor], *, timeout_s: float = 600.0, version: int | None = None
    ) -> str:
        """POST the weights as one safetensors blob; blocking (the Trainer publishes from sync code). An
        ``AdapterPayload`` (LoRA tensors) goes with its config in the blob's metadata (Ludic's server); a tied
        tensor goes once, its other names in the metadata (``weight_sync.tied_names``)."""
        from safetensors.torch import save

        if not self.enable_weight_updates:
            raise RuntimeError("VLLMChatClient(enable_weight_updates=False) cannot sync weights")
        config = getattr(params, "config", None)  # an AdapterPayload: its config rides in the metadata
        tensors, aliases = sendable_once(params)  # a tied tensor's bytes once, its other names in the metadata
        metadata = aliases_metadata(aliases)
        if config is not None:
            metadata[ADAPTER_METADATA_KEY] = json.dumps(config.to_json())
        blob = save(tensors, metadata=metadata or None)
        path = "/ludic/update_weights_blob" + (f"?version={int(version)}" if version is not None else "")
        headers = {**self._headers, "Content-Type": "application/octet-stream", "Content-Length": str(len(blob))}
        payload = self.retry.call(  # timeout_s ([timeouts].publish_s) bounds the upload: ServerTimeout past it
            lambda left: self.sync_client().post(self.base_url + path, content=in_pieces(blob), headers=headers,
                                                 timeout=left),
            path, retry=False, bound_s=timeout_s, peer=self.base_url,
        )  # fmt: skip
        return str(payload.get("status"))

    def declare_restore(self, version: int, *, timeout_s: float | None = None) -> bool:
        """``POST /ludic/declare_restore {"version"}``: Ludic's server then takes the next update at ``version``
        though it serves a later one (a trainer resumed from an older checkpoint). False when the server has
        no such route (404: a server without Ludic's version check); a refusal or an error raises."""
        path = "/ludic/declare_restore"
        reply = self.sync_client().post(self.base_url + path, json={"version": int(version)},
                                        timeout=timeout_s or self.timeout_s)  # fmt: skip
        if reply.status_code == 404:
            return False
        if reply.status_code >= 400:
            error = RequestRefused if reply.status_code < 500 else ServerError
            raise error(f"{path} -> HTTP {reply.status_code}: {server_message(reply)}", reply.status_code)
        return True

    # ---- LoRA adapters (vLLM's routes: ``vllm serve --enable-lora``, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) --
    def load_lora_adapter_sync(self, name: str, path: str, *, load_inplace: bool = True,
                               timeout_s: float | None = None) -> str:  # fmt: skip
        """``POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace}``: serve the peft folder at ``path``
        (on the server's file system) as model ``name``; requests pick it with ``model=name``."""
        body = {"lora_name": name, "lora_path": path, "load_inplace": load_inplace}
        return self._post_text("/v1/load_lora_adapter", body, timeout_s)

    def unload_lora_adapter_sync(self, name: str, *, timeout_s: float | None = None) -> str:
        """``POST /v1/unload_lora_adapter {lora_name}``."""
        return self._post_text("/v1/unload_lora_adapter", {"lora_name": name}, timeout_s)

    def _post_text(self, path: str, body: dict[str, Any], timeout_s: float | None) -> str:
        """vLLM answers its LoRA routes with plain text; a 4xx/5xx raises with the server's message."""
        reply = self.sync_client().post(self.base_url + path, json=body, timeout=timeout_s or self.timeout_s)
        if reply.status_code >= 400:
            error = RequestRefused if reply.status_code < 500 else ServerError
            raise error(f"{path} -> HTTP {reply.status_code}: {server_message(reply)}", reply.status_code)
        return reply.text


def in_pieces(blob: bytes, size: int | None = None) -> Iterator[memoryview]:
    """``blob`` as views of at most ``size`` bytes, no copies. httpcore sends a body by slicing off what each
    socket send took, which copies the rest of a ``bytes`` body every time: quadratic in its size (SmolLM2's
    621 MiB blob took 25-35 s to upload on loopback, 1 s in 4 MiB pieces; ``bench/bench_blob_upload.py``)."""
    size = size or UPLOAD_PIECE_BYTES
    view = memoryview(blob)
    for start in range(0, len(view), size):
        yield view[start : start + size]
