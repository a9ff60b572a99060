"""Sharded checkpoints of an FSDP2 model with ``torch.distributed.checkpoint`` (DCP), never unpickled.

Every rank writes its own shards of the model and optimizer state (no full gather); a checkpoint saved
on N ranks loads on any number (DCP reshards). Same layout and calls as :class:`CheckpointManager`::

    output_dir/step_000123/   shard-<r>-model-00001-of-00001.safetensors (each rank's shards),
                              shards.json (files, global shapes, optimizer hyperparameters),
                              scheduler.json, rng_rank<r>.json, trainer_state.json
    output_dir/latest.json    {"step": 123, "path": "step_000123"}

Written into a hidden ``.tmp-*`` folder that rank 0 renames into place once every rank is done;
``latest.json`` is replaced last. Nothing is unpickled: safetensors shards plus JSON
(``_sharded_io``); every file is read and checked on every rank before the model changes, and the
ranks agree on the outcome, so a bad checkpoint raises :class:`CheckpointLoadError` everywhere.
For one safetensors directory ``from_pretrained`` loads, see ``distributed_publish.export_pretrained``.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ludic.training.checkpoint._files import STATE, parse_trainer_state, read_json, write_json_atomic
from ludic.training.checkpoint._io import CheckpointLoadError
from ludic.training.checkpoint._io import restore_rng as restore_rng_state
from ludic.training.checkpoint.manager import CheckpointManager
from ludic.training.config import CheckpointConfig
from ludic.training.parallel._sharded_io import (
    check_shards,
    flat_state,
    optimizer_state,
    read_shards,
    save_shards,
    write_manifest,
)
from ludic.training.parallel.collective_timeout import named_collective
from ludic.training.parallel.collectives import all_gather_json, all_reduce_tensor, broadcast_json
from ludic.training.parallel.fsdp import is_fsdp_model

_FORMAT = "dcp-safetensors"


def make_checkpointer(cfg: CheckpointConfig, model: nn.Module) -> Any:
    """DCP checkpoints for an FSDP2-sharded model under torch.distributed, else :class:`CheckpointManager`."""
    if is_fsdp_model(model) and dist.is_initialized():
        return DistributedCheckpointer(cfg)
    return CheckpointManager(cfg)


def _rng_json() -> dict[str, Any]:
    np_state = np.random.get_state()
    state = {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *[float(x) for x in np_state[2:]]],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state().tolist()
    return state


def _parse_rng(state: Any, file: Path) -> dict[str, Any]:
    """Check a ``rng_rank<r>.json`` and put it in the setters' form (changes nothing)."""
    try:
        version, internal, gauss = state["python"]
        name, keys, pos, has_gauss, cached = state["numpy"]
        parsed = {
            "python": (int(version), tuple(int(x) for x in internal), None if gauss is None else float(gauss)),
            "numpy": (str(name), np.array(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)),
            "torch": torch.tensor(state["torch"], dtype=torch.uint8),
            "cuda": torch.tensor(state["cuda"], dtype=torch.uint8) if "cuda" in state else None,
        }
    except (KeyError, TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise CheckpointLoadError(f"{file}: not an RNG state written by this version ({exc!r})") from None
    if parsed["torch"].numel() != torch.get_rng_state().numel() or len(parsed["python"][1]) != 625:
        raise CheckpointLoadError(f"{file}: RNG state has the wrong size")
    return parsed


def _all_finite(model: nn.Module) -> bool:
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    ok = all(bool(torch.isfinite(t).all()) for t in local if t.is_floating_point() and t.numel())
    return bool(all_reduce_tensor(torch.tensor([int(ok)]), "min").item())


class DistributedCheckpointer(CheckpointManager):
    """:class:`CheckpointManager`'s interface, with the model and optimizer saved as DCP shards."""

    def __init__(self, cfg: CheckpointConfig) -> None:
        super().__init__(cfg)
        self.rank = dist.get_rank()

    def _write(self, model: nn.Module, optimizer: Any, scheduler: Any, step: int, extra: dict[str, Any]) -> Path:
        """Collective: every rank calls it. Writes ``step_<step>/`` and points ``latest.json`` at it. A rank
        that never arrives (its host died) fails the others within the group's timeout with ``WaitTimeout``
        naming the save, this rank and the time waited (gloo names no rank, so neither can this)."""
        with named_collective(f"DCP save of step {step}"):
            return self._write_collective(model, optimizer, scheduler, step, extra)

    def _write_collective(
        self, model: nn.Module, optimizer: Any, scheduler: Any, step: int, extra: dict[str, Any]
    ) -> Path:
        if not _all_finite(model):
            raise ValueError("refusing to checkpoint non-finite weights (NaN/inf on some rank)")
        final, tmp = self._step_dirs(step)
        tmp = Path(broadcast_json(str(tmp)))  # rank 0's name for every rank
        if self.rank == 0:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._remove_stale_tmp()
            tmp.mkdir()
        dist.barrier()
        tensors, plain = flat_state(model, optimizer if self.cfg.save_optimizer else None)
        save_shards(tmp, tensors)
        write_json_atomic(tmp / f"rng_rank{self.rank}.json", _rng_json())
        dist.barrier()
        if self.rank == 0:
            write_manifest(tmp, tensors, plain)
            if scheduler is not None and self.cfg.save_optimizer:
                write_json_atomic(tmp / "scheduler.json", _scheduler_state(scheduler))
            payload = {"step": step, "time": time.time(), "world_size": dist.get_world_size(), "format": _FORMAT}
            write_json_atomic(tmp / STATE, {**payload, **extra})
            self._publish_dir(tmp, final)
            self._point_latest(step, final)
        dist.barrier()
        return final

    def _load_folder(
        self, folder: Path, model: nn.Module, optimizer: Any, scheduler: Any, restore_rng: bool
    ) -> dict[str, Any]:
        """Collective: check every file on every rank, agree, then load (model and optimizer in new buffers).

        ``CheckpointManager.load`` calls it, so ``fallback=True`` works the same way (every rank sees the
        same files, so every rank takes the same older checkpoint). A rank that never arrives: ``WaitTimeout``.
        """
        with named_collective(f"DCP load of {folder.name}"):
            return self._load_collective(folder, model, optimizer, scheduler, restore_rng)

    def _load_collective(
        self, folder: Path, model: nn.Module, optimizer: Any, scheduler: Any, restore_rng: bool
    ) -> dict[str, Any]:
        try:
            checked, error = self._check_folder(folder, model, optimizer, scheduler, restore_rng), None
        except CheckpointLoadError as exc:
            checked, error = None, f"rank {self.rank}: {exc}"
        errors = [e for e in all_gather_json(error) if e]
        if errors:
            raise CheckpointLoadError("; ".join(errors))
        info, tensors, plain, manifest, sched, rng = checked  # type: ignore[misc]
        try:  # every rank reads (a collective), then all agree: one rank's NaN shard stops every rank
            loaded, error = read_shards(folder, tensors), None
        except CheckpointLoadError as exc:
            loaded, error = None, f"rank {self.rank}: {exc}"
        errors = [e for e in all_gather_json(error) if e]
        if errors:
            raise CheckpointLoadError("; ".join(errors))
        self._apply(model, optimizer, loaded, plain, manifest)
        if sched is not None:
            scheduler.load_state_dict(sched)
        if rng is not None:
            restore_rng_state(rng)
        info["path"] = str(folder)
        return info

    def _check_folder(
        self, folder: Path, model: nn.Module, optimizer: Any, scheduler: Any, restore_rng: bool
    ) -> tuple[Any, ...]:
        """Every file this rank needs, read as JSON/safetensors headers and checked; changes nothing."""
        info = parse_trainer_state(folder / STATE)
        if info.get("format") != _FORMAT:
            raise CheckpointLoadError(
                f"{folder / STATE}: format {info.get('format')!r}, expected {_FORMAT!r} (a one-process "
                "checkpoint, or torch DCP's pickled format from an older Ludic, which is not loaded)"
            )
        tensors, plain = flat_state(model, optimizer)
        manifest = check_shards(folder, tensors, plain)
        sched = None
        if scheduler is not None and (folder / "scheduler.json").is_file():
            sched = read_json(folder / "scheduler.json")
            if not isinstance(sched, dict) or set(sched) != set(scheduler.state_dict()):
                raise CheckpointLoadError(f"{folder / 'scheduler.json'}: not a {type(scheduler).__name__} state")
        rng_file = folder / f"rng_rank{self.rank}.json"
        rng = _parse_rng(read_json(rng_file), rng_file) if restore_rng and rng_file.is_file() else None
        return info, tensors, plain, manifest, sched, rng

    @staticmethod
    def _apply(model: nn.Module, optimizer: Any, loaded: dict, plain: Any, manifest: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        weights = {k[len("model/"):]: v for k, v in loaded.items() if k.startswith("model/")}
        set_model_state_dict(model, weights)
        if optimizer is not None:
            state = optimizer_state(loaded, manifest["optimizer"], plain)
            set_optimizer_state_dict(model, optimizer, state)


def _scheduler_state(scheduler: Any) -> dict[str, Any]:
    state = scheduler.state_dict()
    try:
        json.dumps(state)
    except TypeError as exc:
        raise TypeError(
            f"{type(scheduler).__name__}.state_dict() is not JSON-serialisable ({exc}); "
            "DCP checkpoints store the scheduler as JSON"
        ) from exc
    return state
