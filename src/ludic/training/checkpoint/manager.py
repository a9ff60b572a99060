"""Crash-safe checkpoints: model, optimizer, scheduler, step, RNG states and config.

Layout::

    output_dir/step_000123/   model (save_pretrained / safetensors), optimizer.pt, scheduler.pt,
                              rng_state.pt, trainer_state.json
    output_dir/latest.json    {"step": 123, "path": "step_000123"}

A checkpoint is written into a hidden temporary folder and renamed into place only when complete;
``latest.json`` is replaced atomically last. A crash mid-write leaves at most a ``.tmp-*`` folder,
which no loader looks at and the next save removes.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ludic.training.checkpoint._fallback import check_fallback_skip
from ludic.training.checkpoint._files import (
    LATEST,
    STATE,
    list_complete,
    parse_trainer_state,
    read_latest,
    step_dirname,
    step_of,
    write_json_atomic,
    written_at,
)
from ludic.training.checkpoint._io import (
    CheckpointLoadError,
    capture_rng,
    check_optimizer_state,
    load_plain,
    parse_rng,
)
from ludic.training.checkpoint._io import restore_rng as restore_rng_state
from ludic.training.checkpoint._model_io import (
    apply_model_state,
    assert_finite_weights,
    check_model_state,
    is_peft_model,
    read_adapter_state,
    read_model_state,
    save_model_weights,
)
from ludic.training.checkpoint._tokenizer import save_tokenizer
from ludic.training.config import CheckpointConfig

_log = logging.getLogger(__name__)
_write_json_atomic = write_json_atomic  # kept for callers that imported the private name
__all__ = ["CheckpointLoadError", "CheckpointManager"]


_OWN_TMP = re.compile(r"\.tmp-(old-)?step_\d+-[0-9a-f]{8}")  # the temp names this manager writes


class CheckpointManager:
    """Writes, prunes and restores checkpoints under ``cfg.output_dir``."""

    def __init__(self, cfg: CheckpointConfig) -> None:
        self.cfg = cfg
        self.output_dir = Path(cfg.output_dir)
        self.tokenizer: Any = None
        """Saved into each checkpoint beside the weights when set (``ludic train`` sets the run's)."""
        self._last_saved: tuple[int, Path] | None = None

    # ---- saving -------------------------------------------------------------------------------
    def maybe_save(self, model: nn.Module, optimizer: Any = None, *, step: int, **kwargs: Any) -> Path | None:
        """Save when ``every_n_steps`` divides ``step``; returns the folder written, or None."""
        n = self.cfg.every_n_steps
        if n <= 0 or step <= 0 or step % n != 0:
            return None
        return self.save(model, optimizer, step=step, **kwargs)

    def save(
        self,
        model: nn.Module,
        optimizer: Any = None,
        *,
        step: int,
        metadata: Mapping[str, Any] | None = None,
        scheduler: Any = None,
        config: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write a complete checkpoint for ``step`` and point ``latest.json`` at it."""
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"checkpoint step must be an int >= 0, got {step!r}")
        extra = {"metadata": dict(metadata or {}), "config": dict(config or {})}
        folder = self._write(model, optimizer, scheduler, step, extra)
        self._last_saved = (step, folder)
        return folder

    def saved_at(self, step: int) -> Path | None:
        """The folder this manager's latest save wrote, when that save was for ``step`` and the folder is still
        there; else None. Lets the end of a run skip writing again the checkpoint its last step just wrote."""
        if self._last_saved is None or self._last_saved[0] != step:
            return None
        folder = self._last_saved[1]
        return folder if folder.is_dir() else None

    def _write(self, model: nn.Module, optimizer: Any, scheduler: Any, step: int, extra: dict[str, Any]) -> Path:
        """One process writes every file into a temp folder, then renames it to ``step_<step>/``."""
        assert_finite_weights(model)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._remove_stale_tmp()
        final, tmp = self._step_dirs(step)
        tmp.mkdir()
        try:
            save_model_weights(model, tmp)
            save_tokenizer(self.tokenizer, tmp)
            if optimizer is not None and self.cfg.save_optimizer:
                torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            if scheduler is not None and self.cfg.save_optimizer:
                torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(capture_rng(), tmp / "rng_state.pt")
            write_json_atomic(tmp / STATE, {"step": step, "time": time.time(), **extra})
            self._publish_dir(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._point_latest(step, final)
        return final

    def _step_dirs(self, step: int) -> tuple[Path, Path]:
        """``step_<step>/`` and a fresh temp folder name beside it (``.tmp-*``, removed on the next save)."""
        final = self.output_dir / step_dirname(step)
        return final, self.output_dir / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"

    def _point_latest(self, step: int, final: Path) -> None:
        """Name the published ``final`` in ``latest.json``, then prune the older checkpoints."""
        write_json_atomic(self.output_dir / LATEST, {"step": step, "path": final.name})
        self._prune(keep_also=final)

    def _publish_dir(self, tmp: Path, final: Path) -> None:
        # os.replace cannot overwrite a non-empty folder: move an old copy of this step aside first.
        trash = None
        if final.exists() or final.is_symlink():
            _check_ours(final)
            trash = final.with_name(f".tmp-old-{final.name}-{uuid.uuid4().hex[:8]}")
            os.replace(final, trash)
        os.replace(tmp, final)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)

    def _remove_stale_tmp(self) -> None:
        """Remove temp folders an interrupted save left: only names ``_step_dirs``/``_publish_dir`` write, so
        a user's own ``.tmp-notes`` in a checkpoint folder they chose is never touched."""
        for p in self.output_dir.glob(".tmp-*"):
            if p.is_dir() and not p.is_symlink() and _OWN_TMP.fullmatch(p.name):
                shutil.rmtree(p, ignore_errors=True)

    def _prune(self, keep_also: Path) -> None:
        """Delete all but the ``max_to_keep`` most recently written checkpoints.

        Recency is the write time in ``trainer_state.json``, not the step number, so folders an
        older run left with higher steps never push out this run's; the checkpoint just written
        (``keep_also``) and the one ``latest.json`` names are never deleted.
        """
        keep = self.cfg.max_to_keep
        if keep is None:
            return
        protected = {keep_also.resolve()}
        latest = self._latest_or_none()
        if latest is not None:
            protected.add(latest.resolve())
        by_age = sorted(self.list_checkpoints(), key=lambda sp: (written_at(sp[1]), sp[0]))
        others = [path for _, path in by_age if path.resolve() not in protected]
        n_delete = len(others) + len(protected) - keep
        for path in others[: max(n_delete, 0)]:
            shutil.rmtree(path, ignore_errors=True)

    # ---- finding and loading ------------------------------------------------------------------
    def list_checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first."""
        return list_complete(self.output_dir)

    def latest_path(self) -> Path | None:
        """The folder ``latest.json`` points at, or None before the first save.

        Raises :class:`CheckpointLoadError` when ``latest.json`` is unreadable or names a missing folder.
        """
        return read_latest(self.output_dir)

    def has_checkpoint(self) -> bool:
        """Whether there is anything to resume from: a ``latest.json`` (even a broken one) or a complete folder."""
        return (self.output_dir / LATEST).is_file() or bool(self.list_checkpoints())

    def _latest_or_none(self) -> Path | None:
        try:
            return self.latest_path()
        except CheckpointLoadError:
            return None

    def _resolve(self, step: int | None, path: str | Path | None) -> Path:
        if path is not None:
            folder = Path(path)
        elif step is not None:
            folder = self.output_dir / step_dirname(step)
        else:
            folder = self.latest_path()  # type: ignore[assignment]
            if folder is None:
                raise FileNotFoundError(f"no checkpoint to load: {self.output_dir / LATEST} does not exist")
        if not (folder / STATE).is_file():
            raise FileNotFoundError(f"{folder} is not a complete checkpoint (no {STATE})")
        return folder

    def load(
        self,
        model: nn.Module,
        optimizer: Any = None,
        step: int | None = None,
        path: str | Path | None = None,
        *,
        scheduler: Any = None,
        restore_rng: bool = True,
        fallback: bool = False,
    ) -> dict[str, Any]:
        """Restore a checkpoint (latest by default) in place; returns its ``trainer_state.json``.

        All files are read and checked against ``model``/``optimizer`` before anything changes: a
        checkpoint that fails to load raises :class:`CheckpointLoadError` naming the file and leaves
        both untouched. ``fallback=True`` then loads the newest complete older checkpoint (also when
        ``latest.json`` itself is unreadable or names a missing folder), logging a warning that says
        which; the returned state then has ``fell_back_from`` (the folder or file that failed).
        """
        args = (model, optimizer, scheduler, restore_rng)
        try:
            folder = self._resolve(step, path)
        except CheckpointLoadError as exc:  # latest.json unusable
            if not fallback or step is not None or path is not None:
                raise
            return self._fall_back(self.output_dir / LATEST, None, exc, *args)
        try:
            return self._load_folder(folder, *args)
        except CheckpointLoadError as exc:
            if not fallback:
                raise
            return self._fall_back(folder, step_of(folder), exc, *args)

    def _fall_back(
        self, failed: Path, failed_step: int | None, exc: CheckpointLoadError, *args: Any
    ) -> dict[str, Any]:
        """Load the newest complete checkpoint older than ``failed_step`` (any, when it is unknown)."""
        errors = [f"{failed}: {exc}"]
        for step, older in reversed(self.list_checkpoints()):
            if older.resolve() == failed.resolve() or (failed_step is not None and step >= failed_step):
                continue
            try:
                state = parse_trainer_state(older / STATE)
                check_fallback_skip(self.output_dir, older, state, allow=self.cfg.fallback_may_skip_items)
                state = self._load_folder(older, *args)
            except CheckpointLoadError as older_exc:
                errors.append(f"{older}: {older_exc}")
                continue
            _log.warning("checkpoint %s failed to load (%s); fell back to the older %s (step %d)",
                         failed, exc, older, step)  # fmt: skip
            state["fell_back_from"] = str(failed)
            return state
        raise CheckpointLoadError(
            "no checkpoint could be loaded (fallback=True tried every older complete one):\n  "
            + "\n  ".join(errors)
        )

    def _load_folder(
        self, folder: Path, model: nn.Module, optimizer: Any, scheduler: Any, restore_rng: bool
    ) -> dict[str, Any]:
        files = _read_checkpoint(folder, model, optimizer, scheduler, restore_rng)
        apply_model_state(model, files["model"], folder)  # everything read and checked: now apply
        if optimizer is not None:
            optimizer.load_state_dict(files["optimizer"])
        if files.get("scheduler") is not None:
            scheduler.load_state_dict(files["scheduler"])
        if files.get("rng") is not None:
            restore_rng_state(files["rng"])
        state = files["state"]
        state["path"] = str(folder)
        return state


def _read_checkpoint(
    folder: Path, model: nn.Module, optimizer: Any, scheduler: Any, rng: bool
) -> dict[str, Any]:
    """Every file the load needs, read (without running code) and checked; changes nothing."""
    state = parse_trainer_state(folder / STATE)
    if is_peft_model(model):
        weights = read_adapter_state(folder)
    else:
        weights = read_model_state(folder)
        check_model_state(model, weights, folder)
    files: dict[str, Any] = {"state": state, "model": weights}
    if optimizer is not None:
        opt_file = folder / "optimizer.pt"
        if not opt_file.is_file():
            raise CheckpointLoadError(f"{folder} has no optimizer.pt (saved with save_optimizer=False?)")
        files["optimizer"] = load_plain(opt_file)
        check_optimizer_state(optimizer, files["optimizer"], file=opt_file)
    if scheduler is not None and (folder / "scheduler.pt").is_file():
        files["scheduler"] = load_plain(folder / "scheduler.pt")
    if rng and (folder / "rng_state.pt").is_file():
        files["rng"] = parse_rng(load_plain(folder / "rng_state.pt"), file=folder / "rng_state.pt")
    return files


def _check_ours(final: Path) -> None:
    """An existing ``step_<N>/`` is replaced only when a save wrote it (its ``trainer_state.json`` is written
    before the folder gets its name) or it is empty: a user's own folder of that name is never deleted."""
    if final.is_dir() and not final.is_symlink() and ((final / STATE).is_file() or not any(final.iterdir())):
        return
    raise FileExistsError(
        f"checkpoint: {final} exists and is not a checkpoint Ludic wrote (no {STATE}); move it away or choose "
        "another checkpoint directory (nothing was deleted)"
    )
