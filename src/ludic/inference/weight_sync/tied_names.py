"""Tied tensors in a weight blob: each tensor's bytes go once, its other names ride in the metadata.

A tied model's state dict names one tensor twice (SmolLM2's ``lm_head.weight`` is its
``model.embed_tokens.weight``: 113 MB of its 538 MB). safetensors refuses shared memory, so the blob used to
carry a copy of it. Now the blob holds it once and its ``__metadata__`` maps each other name to the one sent
(``ALIASES_METADATA_KEY``); the receiver hands the one tensor to every name, so a receiving model with or
without the tie ends up with the weights it was sent. Tensors that only overlap (two views of one storage)
still each get their own copy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

ALIASES_METADATA_KEY = "ludic.aliases"  # JSON {name: the name it is sent under}


def view_key(tensor: torch.Tensor) -> tuple:
    """What makes two names the very same tensor: storage, offset, shape, stride, dtype and device."""
    return (
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.dtype,
        tensor.device,
    )


def sendable_once(params: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """CPU tensors safetensors can write, each distinct view once, and ``{other name: name sent}`` for the
    names dropped because they are the very same tensor (storage, offset, shape, stride, dtype)."""
    out: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    by_view: dict[tuple, str] = {}
    storages: set[int] = set()
    for name, tensor in params.items():
        t = tensor.detach()
        view = view_key(t)
        if t.numel() and t.device.type != "meta" and view in by_view:
            aliases[name] = by_view[view]
            continue
        by_view[view] = name
        t = t.contiguous().cpu()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in storages else t  # overlapping views: copies of their own
        storages.add(ptr)
    return out, aliases


def aliases_metadata(aliases: Mapping[str, str]) -> dict[str, str]:
    """The blob metadata entry for ``aliases`` (none when there are none)."""
    return {ALIASES_METADATA_KEY: json.dumps(dict(aliases))} if aliases else {}


def read_aliases(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """``{other name: name sent}`` from a blob's metadata; ValueError naming what is malformed."""
    raw = (metadata or {}).get(ALIASES_METADATA_KEY)
    if raw is None:
        return {}
    try:
        aliases = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"metadata {ALIASES_METADATA_KEY!r} is not JSON: {exc}") from None
    return check_aliases(aliases, f"metadata {ALIASES_METADATA_KEY!r}")


def check_aliases(aliases: Any, where: str = "aliases") -> dict[str, str]:
    """``aliases`` as read from JSON, if it maps non-empty names to names; ValueError naming ``where`` if not."""
    if not isinstance(aliases, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in aliases.items()
    ):
        raise ValueError(f"{where} must map names to names (a JSON object of non-empty strings)")
    return aliases


def with_aliases(params: Mapping[str, torch.Tensor], aliases: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """``params`` with every alias naming the tensor it stands for; ValueError when an alias points at a
    name the blob does not hold or repeats one it does (either would leave a weight to chance)."""
    out = dict(params)
    for alias, sent in aliases.items():
        if sent not in params:
            raise ValueError(f"tied name {alias!r} points at {sent!r}, which the blob does not hold")
        if alias in params:
            raise ValueError(f"tied name {alias!r} is also sent as a tensor of its own")
        out[alias] = params[sent]
    return out
