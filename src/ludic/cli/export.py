"""``ludic export RUN_OR_CHECKPOINT OUT``: a plain transformers folder (weights, config, tokenizer) from a run.

A LoRA checkpoint (an adapter folder: ``adapter_config.json``) is merged into its base, ``W + scaling * B @ A``
per adapted layer (``ludic.training._lora.merged_state_dict``, the weights a merged publish serves), so
``AutoModelForCausalLM.from_pretrained(OUT)`` gives the trained model's logits without peft. A full
fine-tuning checkpoint is loaded and saved as a model folder (no optimizer, RNG or trainer state). OUT is
written into a temporary folder beside it and renamed into place; an OUT that exists and is not an empty
folder is refused, untouched. A damaged checkpoint (a cut or forged file, a missing, stray or non-finite
weight) is refused by name rather than exported as good (``ludic.cli._export_checks``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

from ludic.cli._export_checks import (
    check_adapter_loaded,
    check_loading_info,
    check_model_finite,
    check_weight_files,
    describe,
    load_errors,
    read_adapter_config,
    read_adapter_weights,
    write_errors,
)

TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json")
DTYPES = ("auto", "float32", "bfloat16", "float16")


class ExportError(ValueError):
    """What to export cannot be found or written; nothing was written."""


def add_export_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write a run's model (LoRA merged into its base) as a plain transformers folder",
        description="Write RUN_OR_CHECKPOINT's model to OUT as a folder AutoModelForCausalLM.from_pretrained "
        "loads: a LoRA adapter merged into its base, a full checkpoint as is, with config and tokenizer. A run "
        "folder gives its latest checkpoint (checkpoints/latest.json), else its final_model.",
    )
    p.add_argument("source", metavar="RUN_OR_CHECKPOINT",
                   help="a run's output folder, a checkpoints folder, a step_* checkpoint or a final_model")  # fmt: skip
    p.add_argument("out", metavar="OUT", help="the folder to write (must not exist, or be empty)")
    p.add_argument("--base", default=None,
                   help="the base model of a LoRA adapter (default: the one recorded in its adapter_config.json)")  # fmt: skip
    p.add_argument("--tokenizer", default=None,
                   help="where the tokenizer is (default: the checkpoint, else the base, else the run's final_model)")  # fmt: skip
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="dtype of the written weights (default: the checkpoint's or the base's own)")  # fmt: skip
    p.set_defaults(run=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    try:
        out = export_model(args.source, args.out, base=args.base, tokenizer=args.tokenizer, dtype=args.dtype)
    except ExportError as exc:
        print(f"ludic export: {exc}", file=sys.stderr)
        return 2
    print(f"ludic export: wrote {out}", flush=True)
    return 0


def find_model_folder(source: str | Path) -> Path:
    """The model folder ``source`` names: itself (``config.json`` or ``adapter_config.json``), a checkpoints
    folder's latest, a run folder's ``checkpoints/`` latest, else its ``final_model``."""
    from ludic.training.checkpoint._files import read_latest

    folder = Path(source)
    if not folder.is_dir():
        raise ExportError(f"{folder} is not a folder (give a run's output folder or a checkpoint)")
    if (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file():
        return folder
    for checkpoints in (folder, folder / "checkpoints"):
        latest = read_latest(checkpoints)  # a broken latest.json is a CheckpointLoadError naming it
        if latest is not None:
            return latest
    if (folder / "final_model").is_dir():
        return folder / "final_model"
    raise ExportError(f"{folder} holds no model: expected a run folder (checkpoints/latest.json or final_model/), "
                      "a checkpoints folder (latest.json) or a model folder (config.json or adapter_config.json)")  # fmt: skip


def check_out(out: Path) -> None:
    """OUT must not exist, or be an empty folder: an export never replaces or deletes what is there. Its
    nearest existing parent must be a folder (checked before any model loads, not after)."""
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise ExportError(
            f"{out} exists and is not an empty folder; choose another OUT (nothing was written)"
        )
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ExportError(f"{out} cannot be written: {parent} is not a folder (nothing was written)")


def export_model(
    source: str | Path,
    out: str | Path,
    *,
    base: str | None = None,
    tokenizer: str | None = None,
    dtype: str = "auto",
) -> Path:
    """Write ``source``'s model (see :func:`find_model_folder`) to ``out`` as a plain transformers folder."""
    out = Path(out)
    check_out(out)  # before any model loads
    folder = find_model_folder(source)
    adapter = folder / "adapter_config.json"
    base_path = _base_of(adapter, base) if adapter.is_file() else None
    model = merge_adapter(folder, base_path, dtype) if base_path is not None else _full(folder, dtype)
    tok = _tokenizer(tokenizer, folder, base_path, Path(source))
    tmp = out.parent / f".tmp-export-{out.name}-{uuid.uuid4().hex[:8]}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        check_out(out)  # still free: nothing appeared there meanwhile
        if out.is_dir():
            out.rmdir()  # empty (checked)
        os.replace(tmp, out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # our own temporary folder only
        if isinstance(exc, write_errors()):  # a full disk, a read-only folder: one line, nothing left
            raise ExportError(f"cannot write {out}: {describe(exc)} (nothing was written)") from exc
        raise
    return out


def _base_of(adapter: Path, base: str | None) -> str:
    config = read_adapter_config(adapter)  # invalid JSON or not an object: refused by name
    if base is not None:
        return base
    recorded = config.get("base_model_name_or_path")
    if not isinstance(recorded, str) or not recorded:
        raise ExportError(f"{adapter} names no base model (base_model_name_or_path); pass --base")
    if recorded.startswith(("/", ".")) and not Path(recorded).exists():
        raise ExportError(f"the adapter's base {recorded!r} (from {adapter}) does not exist; pass --base")
    return str(recorded)


def _dtype(dtype: str) -> Any:
    import torch

    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return "auto" if dtype == "auto" else getattr(torch, dtype)


def _full(folder: Path, dtype: str) -> Any:
    """The checkpoint's model, refused unless its files hold every weight, no other, all of the right shape
    and finite (transformers alone would initialize a missing weight at random and export it)."""
    check_weight_files(folder)
    model, info = _load(str(folder), dtype, output_loading_info=True, ignore_mismatched_sizes=True)
    check_loading_info(folder, info)
    check_model_finite(folder, model)
    return model


def _load(path: str, dtype: str, **kwargs: Any) -> Any:
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(dtype), **kwargs)
    except load_errors() as exc:
        raise ExportError(f"cannot load a model from {path}: {describe(exc)}") from exc


def is_adapter(path: str | Path) -> bool:
    """Whether ``path`` is a peft adapter folder (a LoRA run's checkpoint or final_model)."""
    return (Path(path) / "adapter_config.json").is_file()


def merge_adapter(
    folder: str | Path, base_path: str | None = None, dtype: str = "auto", *, _seen: frozenset[Path] = frozenset()
) -> Any:
    """A plain transformers model: the base (``base_path``, default the one the adapter records) with the adapter
    in ``folder`` merged in (peft's ``unload``, then the merged weights loaded). Served or trained as any model:
    an engine given peft's layers would run them in its prefill only, not in its own decoding steps. The
    adapter's files are read and checked first; a base that is an adapter is merged first (a loop refused)."""
    folder = Path(folder)
    if folder.resolve() in _seen:
        raise ExportError(f"{folder} is its own base (adapters whose bases loop); pass --base")
    base_path = _base_of(folder / "adapter_config.json", base_path)
    state = read_adapter_weights(folder)
    from ludic.training._lora import merged_state_dict

    try:
        from peft import PeftModel
    except ImportError as exc:
        raise ExportError(
            f"{folder} is a LoRA adapter: merging it needs peft: pip install 'ludic[peft]'"
        ) from exc
    seen = _seen | {folder.resolve()}
    base_model = merge_adapter(base_path, dtype=dtype, _seen=seen) if is_adapter(base_path) else _load(base_path, dtype)
    try:
        peft_model = PeftModel.from_pretrained(base_model, str(folder))
    except load_errors() as exc:
        raise ExportError(f"cannot load the LoRA adapter {folder} on {base_path}: {describe(exc)}") from exc
    check_adapter_loaded(peft_model, state, folder)
    state = merged_state_dict(peft_model)  # computed before unload: LoRA on a tied layer is refused by name
    plain = peft_model.unload()
    plain.load_state_dict(state, strict=True)
    return plain


def _tokenizer(explicit: str | None, folder: Path, base_path: str | None, source: Path) -> Any:
    from transformers import AutoTokenizer

    candidates = [explicit] if explicit is not None else []
    candidates += [str(folder)] if any((folder / n).is_file() for n in TOKENIZER_FILES) else []
    candidates += [base_path] if base_path is not None else []
    candidates += (
        [str(source / "final_model")] if (source / "final_model" / "tokenizer_config.json").is_file() else []
    )
    if not candidates:
        raise ExportError(
            f"no tokenizer found with {folder} (no {', '.join(TOKENIZER_FILES)}); pass --tokenizer"
        )
    try:
        return AutoTokenizer.from_pretrained(candidates[0])
    except load_errors() as exc:
        raise ExportError(f"cannot load a tokenizer from {candidates[0]}: {describe(exc)}; pass --tokenizer") from exc
