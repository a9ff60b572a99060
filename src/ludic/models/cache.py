"""Where prepared models live: ``$LUDIC_MODELS_DIR``, else ``~/.cache/ludic/models``.

A prepared model is a folder holding a transformers model, its tokenizer and ``ludic-model.json`` (written
last: a folder without it is an interrupted preparation and is never used). Folders are built in a fresh
temporary folder beside their final place and renamed into it, so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ludic.models.errors import ModelPrepError

MARKER = "ludic-model.json"


def models_dir(cache_dir: str | Path | None = None) -> Path:
    """The cache root (created when missing); one that cannot be a folder is a ModelPrepError naming it."""
    where = "--cache-dir"
    if cache_dir is None:
        env = os.environ.get("LUDIC_MODELS_DIR")
        where = "$LUDIC_MODELS_DIR" if env else "the default cache"
        cache_dir = env if env else Path.home() / ".cache" / "ludic" / "models"
    root = Path(cache_dir).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file there, or a parent that is one, or no permission
        raise ModelPrepError(f"the model cache {str(root)!r} ({where}) cannot be a folder: {exc}") from exc
    return root


def is_prepared(folder: Path) -> bool:
    """True when ``folder`` is a finished preparation (its marker exists and reads as JSON)."""
    try:
        json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return True


def build_atomically(target: Path, build: Callable[[Path], dict[str, Any]]) -> Path:
    """``build(tmp)`` fills a fresh temporary folder beside ``target`` and returns the marker's contents;
    the folder is then renamed to ``target``. Another process that finished first wins; ours is dropped.

    A stale, unmarked ``target`` (an interrupted preparation by Ludic) is replaced; anything else there is
    left untouched and refused."""
    if is_prepared(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        info = build(tmp)
        (tmp / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True), encoding="utf-8")
        if target.exists() and not is_prepared(target):
            _remove_interrupted(target)
        try:
            tmp.rename(target)
        except OSError:
            if not is_prepared(target):  # not a finished preparation of another process: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # our own temporary folder, nothing else
    return target


_MODEL_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja", "model.safetensors"}  # fmt: skip


def _remove_interrupted(folder: Path) -> None:
    """Remove a folder that holds only what a preparation writes; refuse anything else."""
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else {"<not a folder>"}
    foreign = sorted(n for n in names if n not in _MODEL_FILES and not n.startswith("model-"))
    if foreign:
        raise FileExistsError(
            f"{str(folder)!r} exists and holds files Ludic did not write ({foreign[:5]}); move it away"
        )
    shutil.rmtree(folder)
