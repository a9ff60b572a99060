"""A peft LoRA model's adapter as a publish payload: the lora_A/lora_B tensors and their config.

For a 7B model with rank-16 adapters on the attention projections this is ~40 MB instead of the ~14 GB
of merged weights (``ludic.training._lora.merged_state_dict``). Which one a run publishes is one
setting on the publisher: ``lora="adapter"`` or ``"merged"`` (the default), read by
``lora_publish_mode``. The base's fingerprint is computed once per model (the base is frozen in a
LoRA run) and sent with every publish, so a server holding another base refuses the adapter.
"""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn

from ludic.inference.weight_sync.adapter_config import (
    AdapterConfig,
    AdapterPayload,
    base_fingerprint,
    lora_names,
)

LORA_MODES = ("merged", "adapter")
_ADAPTER_MARKERS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.", ".lora_magnitude_vector.")
_FINGERPRINTS: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
_LORA_MODULES: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, list]] = weakref.WeakKeyDictionary()


def check_lora_mode(mode: str) -> str:
    if mode not in LORA_MODES:
        raise ValueError(f"lora must be one of {LORA_MODES} (how a peft model is published), got {mode!r}")
    return mode


def lora_publish_mode(publisher: Any) -> str:
    """What ``publisher`` wants from a LoRA model: "adapter" or "merged": its ``lora_publish``, else that of
    the publisher it wraps (``inner``), else merged."""
    for _ in range(8):  # wrappers (probe, rank 0, pipeline version) hold the real publisher as ``inner``
        mode = getattr(publisher, "lora_publish", None)
        if mode is not None:
            return check_lora_mode(mode)
        publisher = getattr(publisher, "inner", None)
        if publisher is None:
            break
    return "merged"


def base_named_tensors(base: nn.Module) -> list[tuple[str, Any]]:
    """The base model's weights under the names a plain (un-wrapped) model has: no adapter tensors,
    ``.base_layer.`` dropped (what the server's ``state_dict`` holds)."""
    return [(k.replace(".base_layer.", "."), v) for k, v in base.state_dict().items()
            if not any(m in k for m in _ADAPTER_MARKERS)]  # fmt: skip


def model_fingerprint(base: nn.Module) -> str:
    """``base_fingerprint`` of ``base``'s frozen weights, computed once per model."""
    cached = _FINGERPRINTS.get(base)
    if cached is None:
        cached = _FINGERPRINTS[base] = base_fingerprint(base_named_tensors(base))
    return cached


def _lora_modules(model: nn.Module, base: nn.Module) -> list[tuple[str, Any]]:
    """``(name, module)`` of ``base``'s peft LoRA layers, found once per base and set of adapter configs:
    walking every module took most of a publish's trainer-side time (~2 ms at 100M parameters)."""
    key = tuple(sorted((name, repr(getattr(cfg, "target_modules", None))) for name, cfg in model.peft_config.items()))
    cached = _LORA_MODULES.get(base)
    if cached is None or cached[0] != key:
        found = [(n, m) for n, m in base.named_modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
        cached = _LORA_MODULES[base] = (key, found)
    return cached[1]


def _adapter_layers(model: nn.Module, base: nn.Module, adapter: str) -> list[tuple[str, Any]]:
    """``(module name, peft LoRA layer)`` for every linear LoRA layer carrying ``adapter``; refuses the kinds
    an adapter publish cannot express (the merged publish handles them)."""
    layers = []
    for name, module in _lora_modules(model, base):
        if adapter in (getattr(module, "lora_embedding_A", None) or {}):
            raise ValueError(f"adapter publishing supports linear LoRA layers; {name} is an embedding: use lora='merged'")
        if adapter not in module.lora_A:
            continue
        if not isinstance(module.lora_A[adapter], nn.Linear):  # a conv's A is [r, in, k...]: no ``B @ A``
            raise ValueError(f"{name}: adapter publishing supports linear LoRA layers, this one adapts a "
                             f"{type(module.base_layer).__name__}: use lora='merged'")  # fmt: skip
        if (getattr(module, "lora_magnitude_vector", None) or {}).get(adapter) is not None:
            raise ValueError(f"adapter publishing does not support DoRA ({name}): use lora='merged'")
        if module.r[adapter] != module.lora_A[adapter].weight.shape[0] or getattr(module, "merged", False):
            raise ValueError(f"{name}: an already-merged LoRA layer cannot be published as an adapter")
        if getattr(module, "fan_in_fan_out", False):
            raise ValueError(f"{name}: fan_in_fan_out LoRA layers cannot be published as adapters: use lora='merged'")
        layers.append((name, module))
    return layers


def adapter_payload(model: nn.Module) -> AdapterPayload:
    """The active adapter of a peft ``model``: detached views of its lora_A/lora_B weights, and its config."""
    if not (hasattr(model, "peft_config") and hasattr(model, "get_base_model")):
        raise ValueError(f"lora='adapter' needs a peft model; {type(model).__name__} has no adapters to publish")
    active = list(getattr(model, "active_adapters", None) or [model.active_adapter])
    if len(active) != 1:  # the forward sums them all; publishing the first served another model
        raise ValueError(f"adapters {active} are all active (the forward adds each): an adapter publish carries "
                         "one; use lora='merged', or set_adapter one of them")  # fmt: skip
    adapter = active[0]
    peft_cfg = model.peft_config[adapter]
    if getattr(peft_cfg, "modules_to_save", None):
        raise ValueError(f"adapter {adapter!r} also trains modules_to_save {peft_cfg.modules_to_save}: an adapter "
                         "publish carries LoRA tensors only; use lora='merged'")  # fmt: skip
    if getattr(peft_cfg, "lora_bias", False):
        raise ValueError(f"adapter {adapter!r} also trains biases (lora_bias=True): an adapter publish carries "
                         "lora_A/lora_B weights only; use lora='merged'")  # fmt: skip
    if getattr(peft_cfg, "bias", "none") != "none":
        raise ValueError(f"adapter {adapter!r} also trains biases (bias={peft_cfg.bias!r}): an adapter publish "
                         "carries lora_A/lora_B weights only; use lora='merged'")  # fmt: skip
    base = model.get_base_model()
    layers = _adapter_layers(model, base, adapter)
    if not layers:
        raise ValueError(f"adapter {adapter!r} has no LoRA layers to publish")
    ranks = {layer.r[adapter] for _, layer in layers}
    if ranks != {int(peft_cfg.r)}:
        raise ValueError(f"adapter {adapter!r} has per-layer ranks {sorted(ranks)} (rank_pattern): one rank per "
                         "adapter publish; use lora='merged'")  # fmt: skip
    tensors = {}
    for name, layer in layers:
        a_name, b_name = lora_names(name)
        tensors[a_name] = layer.lora_A[adapter].weight.detach()  # [r, in]
        tensors[b_name] = layer.lora_B[adapter].weight.detach()  # [out, r]
    config = AdapterConfig(
        rank=int(peft_cfg.r), alpha=float(peft_cfg.lora_alpha), target_modules=tuple(n for n, _ in layers),
        scalings=tuple(float(layer.scaling[adapter]) for _, layer in layers),
        base_fingerprint=model_fingerprint(base), name=adapter,
    )  # fmt: skip
    return AdapterPayload(tensors, config)
