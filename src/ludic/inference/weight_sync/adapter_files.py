"""An adapter publish as a peft adapter folder: what ``vllm serve --enable-lora`` loads by path.

``adapter_config.json`` (peft's fields: ``r``, ``lora_alpha``, ``target_modules``, ``use_rslora``...) and
``adapter_model.safetensors`` (``base_model.model.{module}.lora_A.weight`` ``[r, in]`` and ``lora_B``
``[out, r]``, peft's key layout). Ludic's own facts ride in the safetensors ``__metadata__``, which peft
and vLLM ignore: the full ``AdapterConfig`` (per-module scalings, the base's fingerprint) and the
weight version, so Ludic's server can check the base and keep the trainer's version; a folder without
them is refused by Ludic's server (it cannot tell which base the adapter belongs to).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
from pathlib import Path

from ludic.inference.weight_sync.adapter_config import ADAPTER_METADATA_KEY, AdapterConfig, AdapterPayload
from ludic.inference.weight_sync.weights import parse_version

PEFT_PREFIX = "base_model.model."
VERSION_METADATA_KEY = "ludic_weight_version"
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"


def _uses_rslora(config: AdapterConfig) -> bool:
    """peft's (and vLLM's) scaling is ``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA: one for every module."""
    plain, rs = config.alpha / config.rank, config.alpha / math.sqrt(config.rank)
    if all(math.isclose(s, plain, rel_tol=1e-6) for s in config.scalings):
        return False
    if all(math.isclose(s, rs, rel_tol=1e-6) for s in config.scalings):
        return True
    raise ValueError("per-module alphas (alpha_pattern) cannot be written as one peft adapter_config: use lora='merged'")


def peft_config_json(config: AdapterConfig, base_model: str = "") -> dict[str, object]:
    """peft's ``adapter_config.json`` for ``config`` (target_modules by their last name component)."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": config.rank, "lora_alpha": config.alpha,
        "target_modules": sorted({m.rsplit(".", 1)[-1] for m in config.target_modules}),
        "use_rslora": _uses_rslora(config), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "modules_to_save": None, "base_model_name_or_path": base_model,
    }  # fmt: skip


def write_adapter_folder(payload: AdapterPayload, folder: str | Path, *, version: int | None = None,
                         base_model: str = "") -> Path:  # fmt: skip
    """Write ``payload`` as a peft adapter folder: into a fresh temporary folder of its own (two writers never
    mix files), renamed into place when complete; an adapter folder already there (the same version published
    again, say after a restart) is replaced, anything else there is refused untouched."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_sibling(folder, ".tmp")
    try:
        metadata = {ADAPTER_METADATA_KEY: json.dumps(payload.config.to_json())}
        if version is not None:
            metadata[VERSION_METADATA_KEY] = str(parse_version(version))
        tensors = {PEFT_PREFIX + name: t.detach().contiguous().cpu() for name, t in payload.items()}
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata=metadata)
        config = json.dumps(peft_config_json(payload.config, base_model), indent=1)
        (tmp / CONFIG_FILE).write_text(config, encoding="utf-8")
        _move_into_place(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def _fresh_sibling(folder: Path, prefix: str) -> Path:
    """A new empty folder beside ``folder``, of a name no other writer uses (mode as ``mkdir``'s: the umask's,
    so a server running as another user can read it, as it can ``folder``)."""
    sibling = folder.with_name(f"{prefix}-{folder.name}-{secrets.token_hex(6)}")
    sibling.mkdir()
    return sibling


def _is_adapter_folder(folder: Path) -> bool:
    """A real folder (no link) holding nothing but what ``write_adapter_folder`` writes."""
    return folder.is_dir() and not folder.is_symlink() and {p.name for p in folder.iterdir()} <= {CONFIG_FILE, WEIGHTS_FILE}


def _move_into_place(tmp: Path, folder: Path) -> None:
    """``tmp`` renamed to ``folder``; an adapter folder there is moved aside first, then deleted."""
    if not (folder.exists() or folder.is_symlink()):
        os.replace(tmp, folder)
        return
    if not _is_adapter_folder(folder):
        raise FileExistsError(f"{folder} exists and is not an adapter folder (only {CONFIG_FILE} and {WEIGHTS_FILE}): "
                              "refusing to replace it; choose another adapter_dir or lora_name")  # fmt: skip
    old = _fresh_sibling(folder, ".old")
    os.replace(folder, old / folder.name)
    try:
        os.replace(tmp, folder)
    except OSError:  # another writer got there in between: its folder stays, ours is dropped
        if not folder.exists():
            os.replace(old / folder.name, folder)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def read_adapter_folder(folder: str | Path, *, max_bytes: int | None = None) -> tuple[AdapterPayload, int | None]:
    """The payload and weight version a folder written by ``write_adapter_folder`` holds; ValueError naming
    what is missing or too large (``max_bytes``, from the header, before any tensor is read). Only
    safetensors and JSON are read: nothing in the folder can run code."""
    from safetensors import safe_open

    folder = Path(folder)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise ValueError(f"lora_path {str(folder)!r} holds no {WEIGHTS_FILE}")
    with safe_open(str(weights), framework="pt") as f:
        metadata = f.metadata() or {}
        if ADAPTER_METADATA_KEY not in metadata:
            raise ValueError(f"{weights} carries no {ADAPTER_METADATA_KEY!r} metadata (base fingerprint, scalings): "
                             "Ludic's server serves adapters written by write_adapter_folder only")  # fmt: skip
        size = sum(math.prod(f.get_slice(k).get_shape()) * 8 for k in f.keys())  # noqa: SIM118
        if max_bytes is not None and size > max_bytes:
            raise ValueError(f"{weights} holds up to {size} bytes of tensors, more than the model itself ({max_bytes})")
        tensors = {k.removeprefix(PEFT_PREFIX): f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    config = AdapterConfig.from_json(json.loads(metadata[ADAPTER_METADATA_KEY]))
    raw_version = metadata.get(VERSION_METADATA_KEY)
    return AdapterPayload(tensors, config), None if raw_version is None else parse_version(raw_version)

