"""Crash-safe checkpoints: model, optimizer, scheduler, step, RNG states and config.

Layout (API-NOTES)::

    output_dir/step_000123/   model (save_pretrained / safetensors), optimizer.pt, scheduler.pt,
                              rng_state.pt, trainer_state.json
    output_dir/latest.json    {"step": 123, "path": "step_000123"}

A checkpoint is written into a hidden temporary folder and renamed into place only when complete;
``latest.json`` is replaced atomically last. A crash mid-write leaves at most a ``.tmp-*`` folder,
which no loader looks at and the next save removes.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ludic.training._model_io import assert_finite_weights, load_model_weights, save_model_weights
from ludic.training.config import CheckpointConfig

_STEP_DIR = re.compile(r"^step_(\d+)$")
_LATEST = "latest.json"
_STATE = "trainer_state.json"


def _step_dirname(step: int) -> str:
    return f"step_{step:06d}"


def _capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class CheckpointManager:
    """Writes, prunes and restores checkpoints under ``cfg.output_dir``."""

    def __init__(self, cfg: CheckpointConfig) -> None:
        self.cfg = cfg
        self.output_dir = Path(cfg.output_dir)

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
        assert_finite_weights(model)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._remove_stale_tmp()
        final = self.output_dir / _step_dirname(step)
        tmp = self.output_dir / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            save_model_weights(model, tmp)
            if optimizer is not None and self.cfg.save_optimizer:
                torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            if scheduler is not None and self.cfg.save_optimizer:
                torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(_capture_rng(), tmp / "rng_state.pt")
            state = {"step": step, "time": time.time(), "metadata": dict(metadata or {})}
            state["config"] = dict(config or {})
            _write_json_atomic(tmp / _STATE, state)
            self._publish_dir(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _write_json_atomic(self.output_dir / _LATEST, {"step": step, "path": final.name})
        self._prune()
        return final

    def _publish_dir(self, tmp: Path, final: Path) -> None:
        # os.replace cannot overwrite a non-empty folder: move an old copy of this step aside first.
        trash = None
        if final.exists():
            trash = final.with_name(f".tmp-old-{final.name}-{uuid.uuid4().hex[:8]}")
            os.replace(final, trash)
        os.replace(tmp, final)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)

    def _remove_stale_tmp(self) -> None:
        for p in self.output_dir.glob(".tmp-*"):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)

    def _prune(self) -> None:
        keep = self.cfg.max_to_keep
        if keep is None:
            return
        for _step, path in self.list_checkpoints()[:-keep]:
            shutil.rmtree(path, ignore_errors=True)

    # ---- finding and loading ------------------------------------------------------------------
    def list_checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first."""
        if not self.output_dir.is_dir():
            return []
        found = []
        for p in self.output_dir.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir() and (p / _STATE).is_file():
                found.append((int(m.group(1)), p))
        return sorted(found)

    def latest_path(self) -> Path | None:
        """The folder ``latest.json`` points at, or None before the first save."""
        latest = self.output_dir / _LATEST
        if not latest.is_file():
            return None
        return self.output_dir / json.loads(latest.read_text(encoding="utf-8"))["path"]

    def _resolve(self, step: int | None, path: str | Path | None) -> Path:
        if path is not None:
            folder = Path(path)
        elif step is not None:
            folder = self.output_dir / _step_dirname(step)
        else:
            folder = self.latest_path()  # type: ignore[assignment]
            if folder is None:
                raise FileNotFoundError(f"no checkpoint to load: {self.output_dir / _LATEST} does not exist")
        if not (folder / _STATE).is_file():
            raise FileNotFoundError(f"{folder} is not a complete checkpoint (no {_STATE})")
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
    ) -> dict[str, Any]:
        """Restore a checkpoint (latest by default) in place; returns its ``trainer_state.json``."""
        folder = self._resolve(step, path)
        state = json.loads((folder / _STATE).read_text(encoding="utf-8"))
        load_model_weights(model, folder)
        if optimizer is not None:
            if not (folder / "optimizer.pt").is_file():
                raise FileNotFoundError(f"{folder} has no optimizer.pt (saved with save_optimizer=False?)")
            optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))
        if scheduler is not None and (folder / "scheduler.pt").is_file():
            scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=False))
        if restore_rng and (folder / "rng_state.pt").is_file():
            _restore_rng(torch.load(folder / "rng_state.pt", weights_only=False))
        state["path"] = str(folder)
        return state
