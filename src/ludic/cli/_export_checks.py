"""What ``ludic export`` checks in a checkpoint before writing anything, so a damaged one is refused by name
instead of exported as good.

transformers and peft load a folder leniently: a weight missing from the files is initialized at random
(a missing ``lora_B`` leaves the adapter a no-op), a stray one is dropped, an index may name a file outside
the folder, and a truncated or forged file fails with a traceback. Here each of those is a
:class:`CheckpointLoadError` naming the folder or file; the exported weights are the files' own, all finite.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from ludic.training.checkpoint._checks import check_finite
from ludic.training.checkpoint._files import read_json
from ludic.training.checkpoint._io import CheckpointLoadError

ADAPTER_WEIGHTS = "adapter_model*.safetensors"


def load_errors() -> tuple[type[BaseException], ...]:
    """What loading a damaged folder raises (transformers' and peft's own errors, a refused pickle)."""
    from safetensors import SafetensorError

    return (OSError, ValueError, RuntimeError, SafetensorError, pickle.UnpicklingError)


def write_errors() -> tuple[type[BaseException], ...]:
    """What writing OUT raises on a full disk or a refused write (safetensors wraps its I/O errors)."""
    from safetensors import SafetensorError

    return (OSError, SafetensorError)


def describe(exc: BaseException) -> str:
    """One line for a load error; a pickle refused by ``weights_only`` says so instead of torch's essay."""
    if isinstance(exc, pickle.UnpicklingError):
        return "a weights file holds objects other than tensors (refused: loading it could run code)"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def read_adapter_config(adapter: Path) -> dict[str, Any]:
    """``adapter_config.json`` as a JSON object (invalid JSON or another type is refused by name)."""
    config = read_json(adapter)
    if not isinstance(config, dict):
        raise CheckpointLoadError(f"{adapter}: expected a JSON object, got {type(config).__name__}")
    return config


def check_weight_files(folder: Path) -> None:
    """Every ``*.safetensors`` whole (a truncated one is named), and every ``*.index.json`` mapping weights to
    plain file names in ``folder`` (never ``../`` or a path)."""
    from safetensors import SafetensorError, safe_open

    for weights in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt"):
                pass  # the header is parsed and checked against the file's size
        except (OSError, SafetensorError) as exc:
            raise CheckpointLoadError(f"{weights}: truncated or not a safetensors file ({exc})") from None
    for index in sorted(folder.glob("*.index.json")):
        entry = read_json(index)
        weight_map = entry.get("weight_map") if isinstance(entry, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointLoadError(f"{index}: 'weight_map' must be a JSON object")
        for name in sorted({str(v) for v in weight_map.values()}):
            if Path(name).name != name or name in (".", "..") or not (folder / name).is_file():
                raise CheckpointLoadError(f"{index} names {name!r}, not a file in {folder}")


def check_loading_info(folder: Path, info: dict[str, Any]) -> None:
    """No weight missing, unexpected or of another shape than the model's (transformers' own accounting)."""
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        found = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get(kind) or ())
        if found:
            what = kind.replace("_keys", "")
            raise CheckpointLoadError(f"checkpoint {folder} has {what} weights {found[:5]} (refused: not exported)")


def check_model_finite(folder: Path, model: Any) -> None:
    check_finite(f"checkpoint {folder}", model.state_dict().items())


def read_adapter_weights(folder: Path) -> dict[str, Any]:
    """The adapter's tensors, read and checked (whole files, every value finite) before peft sees them."""
    from ludic.training.checkpoint._model_io import read_adapter_state

    if not any(folder.glob(ADAPTER_WEIGHTS)):
        raise CheckpointLoadError(f"LoRA checkpoint {folder} has no adapter_model.safetensors")
    return read_adapter_state(folder)


def check_adapter_loaded(peft_model: Any, state: dict[str, Any], folder: Path) -> None:
    """Every adapter weight the model has comes from ``state``, and ``state`` holds nothing else."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, state)  # the checked tensors, again: peft reports the fit
    missing = sorted(k for k in getattr(result, "missing_keys", []) if "lora_" in k)
    unexpected = sorted(getattr(result, "unexpected_keys", []))
    wrong = ([f"lacks adapter weights {missing[:5]}"] if missing else []) + (
        [f"has weights its adapter_config.json does not name {unexpected[:5]}"] if unexpected else []
    )
    if wrong:
        raise CheckpointLoadError(f"LoRA checkpoint {folder} {' and '.join(wrong)} (refused: not exported)")
