"""What a LoRA adapter publish carries besides its tensors: rank, alpha, targets, scalings, the base's identity.

The wire format both sides agree on (trainer: ``ludic.distributed.lora_payload``; server:
``ludic.inference.embedded.adapters``). Tensors are named after the base module they adapt, as peft names them
inside an adapter: ``{module}.lora_A.weight`` ``[r, in]`` and ``{module}.lora_B.weight`` ``[out, r]``; the
served weight is ``W = W_base + scaling * B @ A`` (LoRA, Hu et al. 2021, arXiv:2106.09685).

``base_fingerprint`` names the base weights an adapter was trained on: a hash of every base tensor's
name, shape and a strided sample of its values, cast to bfloat16 first, so a bf16 trainer and an fp32
server holding the same checkpoint agree, and two checkpoints of one architecture do not.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

SAMPLES_PER_TENSOR = 64
ADAPTER_METADATA_KEY = "ludic_adapter"  # the safetensors metadata key of a blob that carries an adapter


def _number(value: Any) -> bool:
    """An int or float, never a bool (``True`` is not a scaling of 1.0)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def lora_names(module: str) -> tuple[str, str]:
    """The two tensor names of ``module``'s adapter: ``(A, B)``."""
    return f"{module}.lora_A.weight", f"{module}.lora_B.weight"


@dataclass(frozen=True)
class AdapterConfig:
    """One LoRA adapter's shape and identity; checked on construction (also when read from JSON).

    rank / alpha: peft's ``r`` and ``lora_alpha`` (for vLLM's ``adapter_config.json``); target_modules:
    the base modules adapted (``model.layers.0.self_attn.q_proj``); scalings: each one's ``alpha / r``
    (peft's per-module rank/alpha patterns kept); base_fingerprint: ``base_fingerprint`` of the base.
    """

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    scalings: tuple[float, ...]
    base_fingerprint: str
    name: str = "default"

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"adapter rank must be an int >= 1, got {self.rank!r}")
        if not _number(self.alpha) or not math.isfinite(self.alpha):
            raise ValueError(f"adapter alpha must be a finite number, got {self.alpha!r}")
        if not self.target_modules or not all(isinstance(m, str) and m for m in self.target_modules):
            raise ValueError(f"adapter target_modules must be non-empty module names, got {self.target_modules!r}")
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError("adapter target_modules has duplicates")
        if len(self.scalings) != len(self.target_modules):
            raise ValueError(f"{len(self.scalings)} scalings for {len(self.target_modules)} target modules")
        if not all(_number(s) and math.isfinite(s) for s in self.scalings):
            raise ValueError(f"adapter scalings must be finite numbers, got {list(self.scalings)[:5]}")
        if not isinstance(self.base_fingerprint, str) or not self.base_fingerprint:
            raise ValueError("adapter base_fingerprint must be a non-empty string")
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"adapter name must be a non-empty string, got {self.name!r:.50}")

    def tensor_names(self) -> list[str]:
        return [n for m in self.target_modules for n in lora_names(m)]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rank": self.rank, "alpha": self.alpha, "target_modules": list(self.target_modules),
                "scalings": list(self.scalings), "base_fingerprint": self.base_fingerprint}  # fmt: skip

    @classmethod
    def from_json(cls, obj: Any) -> AdapterConfig:
        """ValueError naming what is missing or malformed."""
        if not isinstance(obj, dict):
            raise ValueError(f"adapter config must be a JSON object, got {type(obj).__name__}")
        missing = [k for k in ("rank", "alpha", "target_modules", "scalings", "base_fingerprint") if k not in obj]
        if missing:
            raise ValueError(f"adapter config lacks {missing}")
        if not isinstance(obj["target_modules"], list) or not isinstance(obj["scalings"], list):
            raise ValueError("adapter config target_modules and scalings must be lists")
        return cls(rank=obj["rank"], alpha=obj["alpha"], target_modules=tuple(obj["target_modules"]),
                   scalings=tuple(obj["scalings"]), base_fingerprint=obj["base_fingerprint"],
                   name=obj.get("name", "default"))  # fmt: skip


class AdapterPayload(dict):
    """An adapter publish: ``{tensor name: tensor}`` (``lora_names``) plus its ``config``. Publishers that
    know adapters send it as one; the others refuse it (it is not a state dict of the model)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], config: AdapterConfig) -> None:
        super().__init__(tensors)
        self.config = config
        expected = set(config.tensor_names())
        if set(self) != expected:
            extra, lacking = sorted(set(self) - expected), sorted(expected - set(self))
            raise ValueError(f"adapter payload does not match its config: extra {extra[:3]}, missing {lacking[:3]}")


def is_adapter(payload: object) -> bool:
    return isinstance(payload, AdapterPayload)


def _sample(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1)
    if flat.numel() <= SAMPLES_PER_TENSOR:
        picked = flat
    else:
        # integer positions: a float32 linspace rounds its last index up past the end above 2**24 elements
        steps = torch.arange(SAMPLES_PER_TENSOR, dtype=torch.int64, device=flat.device)
        picked = flat[steps * (flat.numel() - 1) // (SAMPLES_PER_TENSOR - 1)]
    return picked.to(torch.bfloat16) if picked.is_floating_point() else picked


def base_fingerprint(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 of the base weights' names, shapes and sampled values (as bfloat16), in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(named, key=lambda kv: kv[0]):
        digest.update(f"{name}:{list(tensor.shape)};".encode())
        digest.update(_sample(tensor).cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32]


def metadata_adapter_config(metadata: Mapping[str, str]) -> AdapterConfig | None:
    """The adapter config in a safetensors blob's ``__metadata__`` (``ADAPTER_METADATA_KEY``; read with
    ``blob_metadata``), or None for plain weights."""
    raw = metadata.get(ADAPTER_METADATA_KEY)
    return None if raw is None else AdapterConfig.from_json(json.loads(raw))


def blob_metadata(blob: bytes | bytearray) -> dict[str, str]:
    """A safetensors blob's ``__metadata__`` (empty when it has none). The header is JSON after an 8-byte
    little-endian length (the safetensors format)."""
    if len(blob) < 8:
        raise ValueError("not a safetensors blob: fewer than 8 bytes")
    (size,) = struct.unpack("<Q", bytes(blob[:8]))
    if size > len(blob) - 8:
        raise ValueError(f"safetensors header of {size} bytes exceeds the blob")
    metadata = json.loads(bytes(blob[8 : 8 + size])).get("__metadata__") or {}
    if not isinstance(metadata, dict):
        raise ValueError("safetensors __metadata__ is not a JSON object")
    return metadata
