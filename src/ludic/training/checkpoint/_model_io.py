"""Save/load a model's weights in a folder: HF ``save_pretrained`` when available, else safetensors.

Loading reads and checks everything first and copies last, so a bad file changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_model
from torch import nn

from ludic.training.checkpoint._checks import check_finite
from ludic.training.checkpoint._io import CheckpointLoadError, load_plain

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
        try:
            state.update(load_file(str(f)))
        except Exception as exc:
            raise CheckpointLoadError(f"{f}: cannot be read: {type(exc).__name__}: {exc}") from exc
    return state


def _read_bin(folder: Path) -> dict[str, torch.Tensor]:
    """``pytorch_model.bin``, or the shards listed in ``pytorch_model.bin.index.json`` (tensors only)."""
    index = folder / "pytorch_model.bin.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("pytorch_model*.bin"))
    state: dict[str, torch.Tensor] = {}
    for f in files:
        loaded = load_plain(f)
        if not isinstance(loaded, dict) or not all(torch.is_tensor(v) for v in loaded.values()):
            raise CheckpointLoadError(f"{f}: not a state_dict of tensors")
        state.update(loaded)
    return state


def read_model_state(folder: Path) -> dict[str, torch.Tensor]:
    """Every weight in ``folder``: ``model*.safetensors`` (one file or shards), else ``pytorch_model*.bin``."""
    if any(folder.glob("model*.safetensors")):
        return _read_safetensors(folder, "model*.safetensors")
    if any(folder.glob("pytorch_model*.bin")):
        return _read_bin(folder)
    raise CheckpointLoadError(
        f"checkpoint folder {folder} has no model*.safetensors and no pytorch_model*.bin weights"
    )


def check_model_state(model: nn.Module, state: dict[str, torch.Tensor], folder: Path) -> None:
    """Refuse weights that do not fit ``model`` (names, tied storage, shapes) before copying any.

    Keys absent from the files are allowed only when they share storage with a loaded key
    (tied embeddings, which ``save_pretrained`` writes once). Every value finite.
    """
    current = model.state_dict()
    unknown = sorted(set(state) - set(current))
    if unknown:
        raise CheckpointLoadError(f"checkpoint {folder} has keys the model lacks: {unknown[:5]}")
    loaded_ptrs = {current[k].data_ptr() for k in state}
    missing = [k for k in current if k not in state and current[k].data_ptr() not in loaded_ptrs]
    if missing:
        raise CheckpointLoadError(f"checkpoint {folder} lacks weights for {missing[:5]}")
    for key, value in state.items():
        if value.shape != current[key].shape:
            raise CheckpointLoadError(
                f"checkpoint {folder}: {key} has shape {tuple(value.shape)}, the model {tuple(current[key].shape)}"
            )
    check_finite(f"checkpoint {folder}", state.items())


def read_adapter_state(folder: Path) -> dict[str, torch.Tensor]:
    """The adapter's tensors, every one finite (a forged NaN never loads)."""
    state = _read_safetensors(folder, "adapter_model*.safetensors")
    check_finite(f"checkpoint {folder}", state.items())
    return state


def apply_model_state(model: nn.Module, state: dict[str, torch.Tensor], folder: Path) -> None:
    """Copy weights read (and checked) by the functions above into ``model`` in place."""
    if is_peft_model(model):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, state)
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora" in k]
        if unexpected:
            raise RuntimeError(f"adapter checkpoint in {folder} has unexpected keys {unexpected[:5]}")
        return
    current = model.state_dict()
    with torch.no_grad():
        for key, value in state.items():
            current[key].copy_(value.to(current[key].device, current[key].dtype))


def load_model_weights(model: nn.Module, folder: Path) -> None:
    """Load weights written by :func:`save_model_weights` (or HF ``.bin`` files) into ``model``."""
    if is_peft_model(model):
        apply_model_state(model, read_adapter_state(folder), folder)
        return
    state = read_model_state(folder)
    check_model_state(model, state, folder)
    apply_model_state(model, state, folder)


def assert_finite_weights(model: nn.Module) -> None:
    """Refuse to persist NaN/inf weights (one host sync for the whole model)."""
    named = [(n, p) for n, p in model.state_dict().items() if p.is_floating_point()]
    if not named:
        return
    flags = torch.stack([torch.isfinite(p).all() for _, p in named]).cpu()
    if not bool(flags.all()):
        bad = [n for (n, _), ok in zip(named, flags.tolist()) if not ok]
        raise ValueError(f"refusing to checkpoint non-finite weights in {bad[:5]}")
