"""Sharded model + optimizer state as safetensors files and JSON: resharded by DCP, read without unpickling.

``torch.distributed.checkpoint``'s default files unpickle on load: ``.metadata`` with ``pickle.load``
and every non-tensor entry (optimizer param groups) with ``torch.load(weights_only=False)``, so a
planted checkpoint runs code. Here DCP only moves tensors: each rank writes its shards with
``HuggingFaceStorageWriter(save_distributed=True)`` (safetensors; each file's header records the
shard offsets as JSON) and loads them with ``HuggingFaceStorageReader``, which builds DCP's metadata
from those headers. Everything else (optimizer hyperparameters, file list, global shapes) is in
``shards.json``. Before one byte is copied, every file is checked: the listed files and no others, at
their recorded sizes, shards disjoint and covering each tensor (``_shard_layout``), names/shapes/dtypes
matching the model and optimizer, its hyper-parameters typed and in range, no state for an unknown
parameter; once read, every value finite. One error type for all of it: :class:`CheckpointLoadError`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ludic.training.checkpoint._checks import check_finite, check_group_values, check_state_keys, check_value
from ludic.training.checkpoint._files import read_json, write_json_atomic
from ludic.training.checkpoint._io import CheckpointLoadError
from ludic.training.parallel._shard_layout import check_coverage, parse_specs

MANIFEST = "shards.json"
FORMAT = "ludic-dcp-safetensors-1"
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
              torch.uint8: "U8", torch.bool: "BOOL"}  # fmt: skip


def flat_state(model: nn.Module, optimizer: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """``{"model/<fqn>" | "optim/<fqn>/<key>": tensor}`` (DTensor shards) and the optimizer's plain parts."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    tensors = {f"model/{k}": v for k, v in get_model_state_dict(model).items()}
    if optimizer is None:
        return tensors, None
    osd = get_optimizer_state_dict(model, optimizer)
    plain_state: dict[str, dict[str, Any]] = {}
    for fqn, entry in osd["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"optim/{fqn}/{key}"] = value
            else:
                plain_state.setdefault(fqn, {})[key] = value
    return tensors, {"state": plain_state, "param_groups": osd["param_groups"]}


def save_shards(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Collective: every rank writes its shards of ``tensors`` into ``folder`` as safetensors."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    seen: set[int] = set()
    unshared = {}
    for key, value in tensors.items():  # tied weights (embeddings = head) share storage: safetensors refuses
        local = value.to_local() if hasattr(value, "to_local") else value
        ptr = local.untyped_storage().data_ptr() if local.numel() else -1
        unshared[key] = value.detach().clone() if ptr in seen else value
        seen.add(ptr)
    dcp.save(unshared, storage_writer=HuggingFaceStorageWriter(str(folder), save_distributed=True))


def write_manifest(folder: Path, tensors: dict[str, torch.Tensor], plain: dict[str, Any] | None) -> None:
    """Rank 0, after every rank saved: the files written, each tensor's global shape/dtype, the plain parts."""
    try:
        json.dumps(plain)
    except TypeError as exc:
        raise TypeError(f"optimizer param groups/state must be JSON-serialisable for a DCP checkpoint ({exc})") from exc
    for key, value in tensors.items():
        if value.dtype not in _ST_DTYPES:
            raise TypeError(f"{key}: dtype {value.dtype} cannot be stored in a safetensors shard")
    files = {p.name: p.stat().st_size for p in sorted(folder.glob("*.safetensors"))}
    specs = {k: {"shape": list(v.shape), "dtype": _ST_DTYPES[v.dtype]} for k, v in tensors.items()}
    write_json_atomic(folder / MANIFEST, {"format": FORMAT, "files": files, "tensors": specs, "optimizer": plain})


def _read_header(path: Path) -> dict[str, tuple[list[int], list[int], str]]:
    """``{key: (offsets, shape, dtype)}`` from one safetensors shard's header (no tensor data read). Every key
    needs its ``saved_offsets`` in ``DCP_SHARDING_INFO`` (the writer always records them): a default of zeros
    would place a forged shard at the origin."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            sharding = json.loads((f.metadata() or {}).get("DCP_SHARDING_INFO", "{}"))
            out = {key: (f.get_slice(key).get_shape(), f.get_slice(key).get_dtype()) for key in f.keys()}  # noqa: SIM118
    except Exception as exc:  # safetensors parses a fixed format: nothing in the file can run
        raise CheckpointLoadError(f"{path}: not a safetensors shard: {type(exc).__name__}: {exc}") from None
    chunks = {}
    for key, (shape, dtype) in out.items():
        entry = sharding.get(key) if isinstance(sharding, dict) else None
        offsets = entry.get("saved_offsets") if isinstance(entry, dict) else None
        if not isinstance(offsets, list):
            raise CheckpointLoadError(f"{path}: DCP_SHARDING_INFO has no saved_offsets list for {key!r}")
        chunks[key] = (offsets, list(shape), dtype)
    return chunks


def _check_files(folder: Path, manifest: dict[str, Any]) -> dict[str, list[tuple[list[int], list[int], str]]]:
    files = manifest["files"]
    present = {p.name for p in folder.glob("*.safetensors")}
    if present != set(files):
        raise CheckpointLoadError(
            f"{folder}: shard files {sorted(present)} differ from {MANIFEST}'s {sorted(files)}"
        )
    chunks: dict[str, list[tuple[list[int], list[int], str]]] = {}
    for name, size in files.items():
        path = folder / name
        header = _read_header(path)
        if not isinstance(size, int) or path.stat().st_size != size:
            raise CheckpointLoadError(f"{path}: {path.stat().st_size} bytes, {MANIFEST} recorded {size!r}")
        for key, chunk in header.items():
            chunks.setdefault(key, []).append(chunk)
    return chunks


def check_shards(folder: Path, expected: dict[str, torch.Tensor], plain: dict[str, Any] | None) -> dict[str, Any]:
    """Read and check ``shards.json`` and every shard header against the current state; returns the manifest."""
    where = folder / MANIFEST
    manifest = read_json(where)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointLoadError(f"{where}: not a {FORMAT} manifest")
    specs = parse_specs(where, manifest.get("tensors"))
    if not isinstance(manifest.get("files"), dict):
        raise CheckpointLoadError(f"{where}: 'files' must be a JSON object")
    if set(specs) != set(expected):
        diff = sorted(set(specs) ^ set(expected))[:5]
        raise CheckpointLoadError(f"{folder}: saved tensors differ from the model/optimizer's ({diff} ...)")
    for key, value in expected.items():
        if specs[key][0] != list(value.shape):
            raise CheckpointLoadError(
                f"{folder}: {key} has shape {specs[key][0]}, the model/optimizer {list(value.shape)}"
            )
    check_coverage(folder, specs, _check_files(folder, manifest))
    if plain is not None:
        _check_optimizer(where, manifest.get("optimizer"), plain)
    return manifest


def _check_optimizer(where: Path, saved: Any, current: dict[str, Any]) -> None:
    """The optimizer's plain parts: the same groups, each hyper-parameter typed and in range, no unknown state."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise CheckpointLoadError(f"{where}: no optimizer param groups (saved with save_optimizer=False?)")
    if [g.get("params") for g in groups] != [g["params"] for g in current["param_groups"]]:
        raise CheckpointLoadError(f"{where}: optimizer param groups name other parameters")
    check_group_values(f"{where}: optimizer", groups, current["param_groups"])
    state = saved.get("state")
    check_state_keys(f"{where}: optimizer", state, current["state"])
    for fqn, entry in state.items():
        if set(entry) != set(current["state"][fqn]):
            raise CheckpointLoadError(f"{where}: optimizer state of {fqn!r} holds {sorted(entry)[:5]}, the "
                                      f"optimizer's {sorted(current['state'][fqn])[:5]}")  # fmt: skip
        for key, value in entry.items():
            check_value(f"{where}: optimizer state of {fqn!r}", key, value, current["state"][fqn][key])


def read_shards(folder: Path, expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Collective: this rank's shards of every tensor, resharded by DCP into new buffers (nothing in place),
    every value finite (else :class:`CheckpointLoadError`, raised on this rank only: the caller agrees)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.api import CheckpointException

    dest = {k: torch.empty_like(v) for k, v in expected.items()}
    try:
        dcp.load(dest, storage_reader=HuggingFaceStorageReader(str(folder)))
    except (Exception, CheckpointException) as exc:  # DCP's own error is a BaseException: fallback must see ours
        raise CheckpointLoadError(f"{folder}: reading the safetensors shards failed: {exc}") from exc
    check_finite(str(folder), ((k, v.to_local() if hasattr(v, "to_local") else v) for k, v in dest.items()))
    return dest


def optimizer_state(loaded: dict[str, torch.Tensor], saved: dict[str, Any], current: dict[str, Any]) -> dict:
    """The optimizer state_dict from the loaded shards and ``shards.json``'s plain parts (tuples kept)."""
    state: dict[str, dict[str, Any]] = {fqn: dict(v) for fqn, v in saved["state"].items()}
    for key, value in loaded.items():
        if key.startswith("optim/"):
            fqn, name = key[len("optim/"):].rsplit("/", 1)
            state.setdefault(fqn, {})[name] = value
    groups = []
    for group, now in zip(saved["param_groups"], current["param_groups"]):
        groups.append({k: tuple(v) if isinstance(now.get(k), tuple) and isinstance(v, list) else v
                       for k, v in group.items()})  # fmt: skip
    return {"state": state, "param_groups": groups}
