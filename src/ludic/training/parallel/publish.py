"""Full weights out of an FSDP2-sharded model, one layer at a time (publishing and export).

Each FSDP unit (a decoder layer, then the root's own weights) is gathered with ``full_tensor()`` on
every rank (an all-gather: every rank must take part, in the same order). Rank 0 merges any LoRA
adapters of that layer (``W + scaling * B @ A``), moves the result to host memory and keeps it; the
other ranks drop it at once. So the extra accelerator memory at any moment is about one layer, and
ranks other than 0 never hold more than one layer; rank 0's host memory holds the payload it hands
to ``PolicyPublisher.publish(state_dict, version)`` (any publisher works unchanged).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ludic.training._lora import ParamFilter, publishable_state_dict
from ludic.training.checkpoint._model_io import is_peft_model
from ludic.training.parallel.collective_timeout import named_collective
from ludic.training.parallel.fsdp import is_fsdp_model

_PEFT_PREFIX = "base_model.model."


def _unit_prefixes(model: nn.Module) -> list[str]:
    """``"model.layers.3."``-style prefixes of the FSDP units below the root, longest first."""
    from torch.distributed.fsdp import FSDPModule

    names = [n for n, m in model.named_modules() if n and isinstance(m, FSDPModule)]
    return sorted((f"{n}." for n in names), key=len, reverse=True)


def _unit_of(key: str, prefixes: list[str]) -> str:
    return next((p for p in prefixes if key.startswith(p)), "")


def _full(t: torch.Tensor) -> torch.Tensor:
    if not callable(getattr(t, "full_tensor", None)):
        return t
    if t.device.type == "cpu" and dist.get_backend() == "nccl":  # CPU-offloaded shard, NCCL gather
        t = t.to(torch.device("cuda", torch.cuda.current_device()))
    return t.full_tensor()


def iter_full_layers(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Yield ``{state-dict key: full tensor}`` one FSDP unit at a time (every rank must iterate).

    Keys are the model's own state-dict keys; units follow state-dict order, so the root's weights
    before the first layer (embeddings) and after the last (norm, head) come as their own chunks.
    """
    prefixes = _unit_prefixes(model)
    chunk: dict[str, torch.Tensor] = {}
    current: str | None = None
    for key, value in model.state_dict().items():
        unit = _unit_of(key, prefixes)
        if chunk and unit != current:
            yield chunk
            chunk = {}
        current = unit
        chunk[key] = _full(value.detach())
    if chunk:
        yield chunk


def _lora_modules(model: nn.Module) -> dict[str, Any]:
    """``state-dict module path -> peft LoRA layer`` for every LoRA layer of ``model``."""
    found = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and hasattr(module, "base_layer") and hasattr(module, "scaling"):
            if getattr(module, "lora_magnitude_vector", None):
                raise NotImplementedError(f"merged publishing of DoRA layers is not supported ({name})")
            if getattr(module, "lora_embedding_A", None):
                raise NotImplementedError(f"merged publishing of LoRA embeddings under FSDP ({name})")
            found[name] = module
    return found


def _merge_lora(chunk: dict[str, torch.Tensor], lora: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Base weights plus their active adapters' ``scaling * B @ A``, under the base model's names."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in chunk.items():
        if ".lora_" in key:
            continue
        module_name, _, leaf = key.rpartition(".")
        owner = module_name.removesuffix(".base_layer")
        layer = lora.get(owner) if module_name.endswith(".base_layer") and leaf == "weight" else None
        if layer is not None and not getattr(layer, "merged", False):
            for a in (a for a in layer.active_adapters if a in layer.lora_A):
                a_w, b_w = chunk[f"{owner}.lora_A.{a}.weight"], chunk[f"{owner}.lora_B.{a}.weight"]
                delta = (b_w.float() @ a_w.float()) * layer.scaling[a]  # W' = W + s * B A
                tensor = tensor + (delta.T if getattr(layer, "fan_in_fan_out", False) else delta).to(tensor.dtype)
        out[key.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".")] = tensor
    return out


def gather_publishable(
    model: nn.Module, param_filter: ParamFilter | None = None, *, publish: str = "merged"
) -> dict[str, torch.Tensor]:
    """The weights to publish: rank 0 gets the merged full state dict (on the CPU), other ranks ``{}``.

    Not sharded: exactly ``publishable_state_dict(model, param_filter, publish=)`` (``publish="adapter"``:
    a peft model's adapter alone). Sharded: must be called on every rank; gathers layer by layer (see
    the module docstring), merged only.
    """
    if not is_fsdp_model(model):
        return publishable_state_dict(model, param_filter, publish=publish)
    if publish == "adapter" and is_peft_model(model):
        raise ValueError("adapter publishing from an FSDP-sharded model is not supported: use lora='merged'")
    main = dist.get_rank() == 0
    lora = _lora_modules(model) if is_peft_model(model) else {}
    out: dict[str, torch.Tensor] = {}
    with named_collective("all-gather of the full weights (a publish or an export)"):
        for chunk in iter_full_layers(model):
            if not main:
                del chunk  # gathered only to take part in the collective
                continue
            merged = _merge_lora(chunk, lora) if lora else chunk
            for key, tensor in merged.items():
                if ".modules_to_save." in key or (param_filter is not None and not param_filter(key, tensor)):
                    continue
                out[key] = tensor.to("cpu", copy=tensor.device.type != "cpu")
    return out


def export_pretrained(model: nn.Module, out_dir: str | Path, *, tokenizer: Any = None) -> Path | None:
    """Write a ``from_pretrained``-loadable directory (config + ``model.safetensors``, LoRA merged).

    Call on every rank (the weights are gathered layer by layer); rank 0 writes into a temporary
    folder renamed into place when complete, and returns the path (other ranks return None).
    """
    from safetensors.torch import save_file

    state = gather_publishable(model)
    if is_fsdp_model(model) and dist.get_rank() != 0:
        return None
    base = model.get_base_model() if is_peft_model(model) else model
    config = getattr(base, "config", None)
    if config is None:
        raise ValueError(f"export_pretrained needs a transformers model with .config, got {type(base).__name__}")
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # from_pretrained ties it to the embeddings again
    final = Path(out_dir)
    tmp = final.with_name(f".tmp-{final.name}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        config.save_pretrained(str(tmp))
        if getattr(base, "generation_config", None) is not None:
            base.generation_config.save_pretrained(str(tmp))
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})  # fmt: skip
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        if final.exists():
            _check_replaceable(final, written={p.name for p in tmp.iterdir()})
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _check_replaceable(final: Path, written: set[str]) -> None:
    """An existing ``out_dir`` is replaced only when the new export rewrites every file in it (an earlier
    export); anything else there is the user's, and nothing of it is deleted."""
    if not final.is_dir():
        raise FileExistsError(f"export_pretrained: {final} exists and is not a directory; choose another out_dir")
    foreign = sorted(p.name for p in final.iterdir() if p.name not in written)
    if foreign:
        raise FileExistsError(
            f"export_pretrained: {final} holds files an export does not write ({', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}); choose an empty or new out_dir (nothing was deleted)"
        )
