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

    An existing ``target`` without a readable marker is refused and left untouched: Ludic only ever renames a
    marked folder into place, so such a folder is not its own (a user's model under ``--cache-dir``, say)."""
    if is_prepared(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    refuse_unmarked(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        info = build(tmp)
        (tmp / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True), encoding="utf-8")
        refuse_unmarked(target)  # it may have appeared while we built
        try:
            tmp.rename(target)
        except OSError:
            if not is_prepared(target):  # not a finished preparation of another process: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # our own temporary folder, nothing else
    return target


def refuse_unmarked(target: Path) -> None:
    """A ModelPrepError when something other than a finished preparation is at ``target``; nothing is removed."""
    if (target.exists() or target.is_symlink()) and not is_prepared(target):
        raise ModelPrepError(
            f"{str(target)!r} exists but is not a model Ludic prepared (no readable {MARKER}); Ludic never "
            "overwrites or deletes it: move it away, or point --cache-dir / $LUDIC_MODELS_DIR elsewhere"
        )
