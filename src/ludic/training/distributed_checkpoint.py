"""Sharded checkpoints of an FSDP2 model with ``torch.distributed.checkpoint`` (DCP).

Every rank writes its own shards of the model and optimizer state (no full gather); a checkpoint saved
on N ranks loads on any number (DCP reshards). Same layout and calls as :class:`CheckpointManager`::

    output_dir/step_000123/   .metadata + __<rank>_0.distcp (DCP: {"model", "optim"}),
                              scheduler.json, rng_rank<r>.json, trainer_state.json
    output_dir/latest.json    {"step": 123, "path": "step_000123"}

Written into a hidden ``.tmp-*`` folder that rank 0 renames into place once every rank is done;
``latest.json`` is replaced last. Nothing here is unpickled: DCP tensors plus JSON.
For one safetensors directory ``from_pretrained`` loads, see ``distributed_publish.export_pretrained``.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ludic.distributed.collectives import all_reduce_tensor, broadcast_json
from ludic.distributed.fsdp import is_fsdp_model
from ludic.training.checkpoint import CheckpointManager, _write_json_atomic
from ludic.training.config import CheckpointConfig

_STATE = "trainer_state.json"


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


def _restore_rng(state: Mapping[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), int(pos), int(has_gauss), cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8))


def _all_finite(model: nn.Module) -> bool:
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    ok = all(bool(torch.isfinite(t).all()) for t in local if t.is_floating_point() and t.numel())
    return bool(all_reduce_tensor(torch.tensor([int(ok)]), "min").item())


class DistributedCheckpointer(CheckpointManager):
    """:class:`CheckpointManager`'s interface, with the model and optimizer saved as DCP shards."""

    def __init__(self, cfg: CheckpointConfig) -> None:
        super().__init__(cfg)
        self.rank = dist.get_rank()

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
        """Collective: every rank calls it. Writes ``step_<step>/`` and points ``latest.json`` at it."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        if not isinstance(step, int) or step < 0:
            raise ValueError(f"checkpoint step must be an int >= 0, got {step!r}")
        if not _all_finite(model):
            raise ValueError("refusing to checkpoint non-finite weights (NaN/inf on some rank)")
        final = self.output_dir / f"step_{step:06d}"
        tmp = Path(broadcast_json(str(self.output_dir / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}")))
        if self.rank == 0:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._remove_stale_tmp()
            tmp.mkdir()
        dist.barrier()
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
        if optimizer is not None and self.cfg.save_optimizer:
            state["optim"] = get_optimizer_state_dict(model, optimizer)
        dcp.save(state, checkpoint_id=str(tmp))
        (tmp / f"rng_rank{self.rank}.json").write_text(json.dumps(_rng_json()), encoding="utf-8")
        dist.barrier()
        if self.rank == 0:
            if scheduler is not None and self.cfg.save_optimizer:
                _write_json_atomic(tmp / "scheduler.json", _scheduler_state(scheduler))
            payload = {"step": step, "time": time.time(), "world_size": dist.get_world_size(), "format": "dcp",
                       "metadata": dict(metadata or {}), "config": dict(config or {})}  # fmt: skip
            _write_json_atomic(tmp / _STATE, payload)
            self._publish_dir(tmp, final)
            _write_json_atomic(self.output_dir / "latest.json", {"step": step, "path": final.name})
            self._prune(keep_also=final)
        dist.barrier()
        return final

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
        """Collective: restore model and optimizer shards (any world size), scheduler, RNG and step.

        ``fallback=True``: if this checkpoint fails to load, load the previous complete ones, newest
        first (each load overwrites every shard, so a half-read one leaves nothing behind).
        """
        folder = self._resolve(step, path)
        try:
            return self._load_dcp(folder, model, optimizer, scheduler, restore_rng)
        except Exception:
            if not fallback:
                raise
            older = [p for _, p in reversed(self.list_checkpoints()) if p.resolve() != folder.resolve()]
            for candidate in older:
                try:
                    return self._load_dcp(candidate, model, optimizer, scheduler, restore_rng)
                except Exception:
                    continue
            raise

    def _load_dcp(
        self, folder: Path, model: nn.Module, optimizer: Any, scheduler: Any, restore_rng: bool
    ) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        info = json.loads((folder / _STATE).read_text(encoding="utf-8"))
        if info.get("format") != "dcp":
            raise ValueError(f"{folder} is not a DCP checkpoint (saved by one process?); load it unsharded")
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
        if optimizer is not None:
            state["optim"] = get_optimizer_state_dict(model, optimizer)
        dcp.load(state, checkpoint_id=str(folder))
        set_model_state_dict(model, state["model"])
        if optimizer is not None:
            set_optimizer_state_dict(model, optimizer, state["optim"])
        if scheduler is not None and (folder / "scheduler.json").is_file():
            scheduler.load_state_dict(json.loads((folder / "scheduler.json").read_text(encoding="utf-8")))
        rng_file = folder / f"rng_rank{self.rank}.json"
        if restore_rng and rng_file.is_file():
            _restore_rng(json.loads(rng_file.read_text(encoding="utf-8")))
        info["path"] = str(folder)
        return info


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
