"""What a run owns in its output folder, so starting over deletes only what Ludic wrote.

A run records the outputs it is about to create in ``<output_dir>/.ludic-outputs.json`` (never a path
that already existed and was not claimed before). ``ludic train --fresh`` and the quickstart then
delete only claimed paths and, in the checkpoint folder, only the ``step_*`` folders, ``.tmp-*``
leftovers and ``latest.json`` a checkpointer writes. Anything else in the way (a user's own file, a
regular file where the checkpoint folder should be) is refused before anything is deleted, with a
message saying what is there.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ludic.training.checkpoint._files import write_json_atomic
from ludic.training.checkpoint.resume import ResumeError

MARKER = ".ludic-outputs.json"
_CHECKPOINT_ENTRY = re.compile(r"^(step_\d+|\.tmp-.*|latest\.json|\.latest\.json\..*\.tmp)$")


class OutputsInTheWay(ResumeError):
    """Starting over would delete something no Ludic run wrote; nothing was deleted."""


def _key(path: Path, owner_dir: Path) -> str:
    try:
        return str(path.resolve().relative_to(owner_dir.resolve()))
    except ValueError:
        return str(path.resolve())


def claimed(owner_dir: Path) -> set[str]:
    """The outputs earlier runs claimed in ``owner_dir`` (empty when there is no readable marker)."""
    return _read_marker(owner_dir)[0]


def _read_marker(owner_dir: Path) -> tuple[set[str], str | None]:
    """``(claimed outputs, None)``, or ``(set(), why the marker cannot be read)`` when one is there but unreadable."""
    marker = owner_dir / MARKER
    if not marker.exists():
        return set(), None
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return set(), f"{marker} cannot be read ({exc})"
    outputs = data.get("outputs") if isinstance(data, dict) else None
    if not isinstance(outputs, list):
        return set(), f"{marker} holds no list of outputs"
    return {o for o in outputs if isinstance(o, str)}, None


def claim_outputs(paths: list[Path], owner_dir: Path) -> None:
    """Record ``paths`` as this run's outputs, except ones that already exist unclaimed (a user's)."""
    owned = claimed(owner_dir)
    for path in paths:
        if not path.exists() and not path.is_symlink():
            owned.add(_key(path, owner_dir))
    owner_dir.mkdir(parents=True, exist_ok=True)
    payload = {"written_by": "ludic", "outputs": sorted(owned)}
    # whole or not at all: a write cut short (disk full, a kill) keeps the earlier marker, not a truncated one
    # that would disown every output it listed
    write_json_atomic(owner_dir / MARKER, payload)


@dataclass
class CleanPlan:
    """What starting over deletes, and what it refuses to (then it deletes nothing)."""

    delete: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def _plan_checkpoint_dir(folder: Path, plan: CleanPlan) -> None:
    if not folder.exists() and not folder.is_symlink():
        return
    if not folder.is_dir() or folder.is_symlink():
        plan.refused.append(f"{folder} is a file, not a checkpoint folder (no Ludic run writes one there)")
        return
    plan.delete.extend(sorted(p for p in folder.iterdir() if _CHECKPOINT_ENTRY.match(p.name)))


def plan_clean(paths: list[Path], *, owner_dir: Path, checkpoint_dir: Path | None) -> CleanPlan:
    """Sort ``paths`` into what a fresh start may delete and what is in the way (changes nothing)."""
    plan, (owned, unreadable) = CleanPlan(), _read_marker(owner_dir)
    for path in paths:
        if checkpoint_dir is not None and path == checkpoint_dir:
            _plan_checkpoint_dir(path, plan)
        elif not path.exists() and not path.is_symlink():
            continue
        elif _key(path, owner_dir) in owned:
            plan.delete.append(path)
        else:
            kind = "folder" if path.is_dir() else "file"
            plan.refused.append(
                f"{path} ({kind}) is not known to be a Ludic run's: {unreadable}" if unreadable
                else f"{path} ({kind}) was not written by a Ludic run (not listed in {owner_dir / MARKER})"
            )  # fmt: skip
    return plan


def clean_outputs(paths: list[Path], *, owner_dir: Path, checkpoint_dir: Path | None) -> list[Path]:
    """Delete what an earlier run wrote among ``paths``; refuse (deleting nothing) if anything else is there."""
    plan = plan_clean(paths, owner_dir=owner_dir, checkpoint_dir=checkpoint_dir)
    if plan.refused:
        raise OutputsInTheWay(
            "not starting over: deleting these could lose files Ludic did not write:\n  "
            + "\n  ".join(plan.refused)
            + "\nmove them away, or point the run at another output_dir"
        )
    for path in plan.delete:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    if checkpoint_dir is not None and checkpoint_dir.is_dir() and not any(checkpoint_dir.iterdir()):
        checkpoint_dir.rmdir()
    return plan.delete
