"""Checkpoint files that hold only tensors and plain data, read without running code.

Every ``.pt`` file is read with ``torch.load(weights_only=True)``: its unpickler rebuilds tensors,
numbers, strings, lists, tuples and dicts and refuses anything else, so a planted pickle (one that
would call ``os.system`` or write a file when loaded) fails with :class:`CheckpointLoadError`
naming the file and nothing in it runs. RNG states are stored in that plain form too (numpy's
state as a tensor + ints rather than an ndarray).
"""

from __future__ import annotations

import pickle
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch


class CheckpointLoadError(RuntimeError):
    """A checkpoint file could not be read or does not fit; model and optimizer were left untouched."""


def load_plain(path: Path) -> Any:
    """``torch.load`` a file that may hold only tensors and plain data (never arbitrary objects)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        message = str(exc)
        refused = re.search(r"GLOBAL (\S+) was not an allowed global", message)
        if refused:
            raise CheckpointLoadError(
                f"{path}: refused to load: it names {refused.group(1)}, not a tensor or plain data, and "
                "loading it could run code (read with torch.load(weights_only=True))"
            ) from None
        detail = re.search(r"WeightsUnpickler error: (.+?)\n\n", message, re.S)
        reason = " ".join(detail.group(1).split()) if detail else message.splitlines()[0]
        raise CheckpointLoadError(f"{path}: cannot be read: not a torch file or corrupt ({reason})") from None
    except Exception as exc:
        raise CheckpointLoadError(f"{path}: cannot be read: {type(exc).__name__}: {exc}") from exc


def capture_rng() -> dict[str, Any]:
    """Python, numpy, torch (and CUDA) RNG states as tensors and plain data."""
    version, mt_state, gauss = random.getstate()
    _, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def parse_rng(state: Any, *, file: Path) -> dict[str, Any]:
    """Check a state written by :func:`capture_rng` and put it in the setters' form (changes nothing)."""
    try:
        py, npy = state["python"], state["numpy"]
        parsed = {
            "python": (py["version"], tuple(py["state"].tolist()), py["gauss"]),
            "numpy": ("MT19937", npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                      npy["cached_gaussian"]),
            "torch": state["torch"],
            "cuda": state.get("cuda"),
        }  # fmt: skip
    except (KeyError, TypeError, AttributeError) as exc:
        raise CheckpointLoadError(f"{file}: not an RNG state written by this version ({exc!r})") from None
    if not torch.is_tensor(parsed["torch"]) or parsed["torch"].dtype != torch.uint8:
        raise CheckpointLoadError(f"{file}: 'torch' is not a torch RNG state (a uint8 tensor)")
    return parsed


def restore_rng(parsed: Mapping[str, Any]) -> None:
    """Set every RNG from :func:`parse_rng`'s result (or a sharded checkpoint's per-rank state, whose
    ``cuda`` is this rank's device state, one tensor, rather than every device's list)."""
    random.setstate(parsed["python"])
    np.random.set_state(parsed["numpy"])
    torch.set_rng_state(parsed["torch"])
    cuda = parsed.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if torch.is_tensor(cuda):
            torch.cuda.set_rng_state(cuda)
        else:
            torch.cuda.set_rng_state_all(cuda)


def check_optimizer_state(optimizer: torch.optim.Optimizer, state: Any, *, file: Path) -> None:
    """Refuse an optimizer state that does not fit ``optimizer`` before anything is changed.

    ``Optimizer.load_state_dict`` checks group sizes but not tensor shapes; a state for another
    model would load and fail later, mid-step. Hyper-parameters typed and in range, every state value
    finite, no state for a parameter the optimizer lacks (``_checks``).
    """
    from ludic.training.checkpoint._checks import check_group_values, check_state_keys

    if not isinstance(state, Mapping) or "param_groups" not in state or "state" not in state:
        raise CheckpointLoadError(f"{file}: not an optimizer state_dict (no 'state'/'param_groups')")
    groups, saved_groups = optimizer.param_groups, state["param_groups"]
    if not isinstance(saved_groups, list):
        raise CheckpointLoadError(f"{file}: 'param_groups' must be a list, got {type(saved_groups).__name__}")
    if len(groups) != len(saved_groups):
        raise CheckpointLoadError(
            f"{file}: has {len(saved_groups)} parameter groups, the optimizer {len(groups)}"
        )
    if not all(isinstance(g, Mapping) and isinstance(g.get("params"), list) for g in saved_groups):
        raise CheckpointLoadError(f"{file}: every parameter group must be a mapping with a 'params' list")
    params = [p for g in groups for p in g["params"]]
    saved_ids = [i for g in saved_groups for i in g["params"]]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in saved_ids) or len(set(saved_ids)) != len(saved_ids):
        raise CheckpointLoadError(f"{file}: parameter ids must be distinct ints, got {saved_ids[:8]!r:.120}")
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in saved_groups]:
        raise CheckpointLoadError(f"{file}: parameter counts per group differ from the optimizer's")
    check_group_values(str(file), saved_groups, groups)
    check_state_keys(str(file), state["state"], saved_ids)
    for param, pid in zip(params, saved_ids):
        for key, value in state["state"].get(pid, {}).items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape != param.shape:
                raise CheckpointLoadError(
                    f"{file}: state {key!r} of parameter {pid} has shape {tuple(value.shape)}, "
                    f"the parameter {tuple(param.shape)}"
                )
