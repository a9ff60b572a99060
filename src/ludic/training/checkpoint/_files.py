"""The plain files of a checkpoint folder tree: ``latest.json``, ``trainer_state.json``, ``step_*`` names.

Every JSON file is parsed and its types checked here, before a loader touches a model, so a
``trainer_state.json`` with ``"step": "four"`` is refused up front instead of after the weights and
optimizer were already replaced.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ludic.training.checkpoint._io import CheckpointLoadError

STEP_DIR = re.compile(r"^step_(\d+)$")
LATEST = "latest.json"
STATE = "trainer_state.json"


def step_dirname(step: int) -> str:
    return f"step_{step:06d}"


def step_of(folder: Path) -> int | None:
    """The step a ``step_*`` folder's name says, None for any other name."""
    m = STEP_DIR.match(folder.name)
    return int(m.group(1)) if m else None


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    """Write ``payload`` to a temporary file, fsync, then rename over ``path`` (never half-written; a write
    that fails, e.g. on a full disk, leaves ``path`` as it was and no temporary file)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=2, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: Path) -> Any:
    """Parse a JSON file; any failure is a :class:`CheckpointLoadError` naming it (never code: JSON only)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointLoadError(f"{path}: cannot be read as JSON: {type(exc).__name__}: {exc}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_trainer_state(path: Path) -> dict[str, Any]:
    """``trainer_state.json`` with every field the loaders use checked (step, metadata, config, format)."""
    state = read_json(path)
    if not isinstance(state, dict):
        raise CheckpointLoadError(f"{path}: expected a JSON object, got {type(state).__name__}")
    step = state.get("step")
    if not _is_int(step) or step < 0:
        raise CheckpointLoadError(f"{path}: 'step' must be an int >= 0, got {step!r}")
    if not isinstance(state.get("time", 0.0), (int, float)) or isinstance(state.get("time"), bool):
        raise CheckpointLoadError(f"{path}: 'time' must be a number, got {state['time']!r}")
    for key in ("metadata", "config"):
        if not isinstance(state.setdefault(key, {}), dict):
            raise CheckpointLoadError(f"{path}: {key!r} must be a JSON object, got {state[key]!r}")
    source = state["metadata"].get("batch_source")
    if source is not None and not isinstance(source, dict):
        raise CheckpointLoadError(f"{path}: metadata.batch_source must be a JSON object, got {source!r}")
    if not isinstance(state.get("format", ""), str):
        raise CheckpointLoadError(f"{path}: 'format' must be a string, got {state['format']!r}")
    return state


def read_latest(output_dir: Path) -> Path | None:
    """The folder ``latest.json`` names (checked: readable, a ``step_*`` folder that is complete).

    None when there is no ``latest.json``; :class:`CheckpointLoadError` when it cannot be used.
    """
    latest = output_dir / LATEST
    if not latest.is_file():
        return None
    entry = read_json(latest)
    name = entry.get("path") if isinstance(entry, dict) else None
    if not isinstance(name, str) or not STEP_DIR.match(name):
        raise CheckpointLoadError(f"{latest}: 'path' must name a step_* folder, got {name!r}")
    folder = output_dir / name
    if not (folder / STATE).is_file():
        raise CheckpointLoadError(f"{latest} names {name}, which is missing or incomplete (no {STATE})")
    return folder


def list_complete(output_dir: Path) -> list[tuple[int, Path]]:
    """``step_*`` folders holding a ``trainer_state.json`` (written last: the folder is complete), oldest first."""
    if not output_dir.is_dir():
        return []
    found = []
    for p in output_dir.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / STATE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def written_at(folder: Path) -> float:
    """The write time ``trainer_state.json`` records (0.0 when unreadable: pruned first)."""
    try:
        return float(parse_trainer_state(folder / STATE).get("time", 0.0))
    except CheckpointLoadError:
        return 0.0
