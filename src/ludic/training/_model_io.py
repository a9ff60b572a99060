"""Save/load a model's weights in a folder: HF ``save_pretrained`` when available, else safetensors."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_model
from torch import nn

_PLAIN_FILE = "model.safetensors"


def is_peft_model(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def save_model_weights(model: nn.Module, folder: Path) -> None:
    """Write weights into ``folder`` (HF/peft layout when the model has ``save_pretrained``)."""
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(str(folder), safe_serialization=True)
    else:
        save_model(model, str(folder / _PLAIN_FILE))


def _read_safetensors(folder: Path, pattern: str) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no {pattern} files in checkpoint folder {folder}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def load_model_weights(model: nn.Module, folder: Path) -> None:
    """Load weights written by :func:`save_model_weights` into ``model`` in place.

    Keys absent from the files are allowed only when they share storage with a loaded key
    (tied embeddings, which ``save_pretrained`` writes once).
    """
    if is_peft_model(model):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, _read_safetensors(folder, "adapter_model*.safetensors"))
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora" in k]
        if unexpected:
            raise RuntimeError(f"adapter checkpoint in {folder} has unexpected keys {unexpected[:5]}")
        return
    state = _read_safetensors(folder, "model*.safetensors")
    current = model.state_dict()
    unknown = sorted(set(state) - set(current))
    if unknown:
        raise RuntimeError(f"checkpoint {folder} has keys the model lacks: {unknown[:5]}")
    loaded_ptrs = {current[k].data_ptr() for k in state}
    missing = [k for k in current if k not in state and current[k].data_ptr() not in loaded_ptrs]
    if missing:
        raise RuntimeError(f"checkpoint {folder} lacks weights for {missing[:5]}")
    with torch.no_grad():
        for key, value in state.items():
            current[key].copy_(value.to(current[key].device, current[key].dtype))


def assert_finite_weights(model: nn.Module) -> None:
    """Refuse to persist NaN/inf weights (one host sync for the whole model)."""
    named = [(n, p) for n, p in model.state_dict().items() if p.is_floating_point()]
    if not named:
        return
    flags = torch.stack([torch.isfinite(p).all() for _, p in named]).cpu()
    if not bool(flags.all()):
        bad = [n for (n, _), ok in zip(named, flags.tolist()) if not ok]
        raise ValueError(f"refusing to checkpoint non-finite weights in {bad[:5]}")
