"""The checks a checkpoint passes as a whole before any of it is applied: finite values, an optimizer's
hyper-parameters typed and in range, no state for a parameter the optimizer does not have.

Shared by the one-process checkpoint (``optimizer.pt``) and the sharded one (``shards.json``), so both
refuse the same things with the same :class:`CheckpointLoadError`: a forged ``lr = "0.1"`` or
``betas = [5, 5]`` would otherwise load and turn the next step into NaN or a type error mid-run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ludic.training.checkpoint._io import CheckpointLoadError

_UNIT = (0.0, 1.0, False)  # [0, 1)
_RANGES: dict[str, tuple[float, float, bool]] = {  # name -> (low, high, high included); low is always included
    "lr": (0.0, math.inf, False),  # 0 is a schedule's legitimate end (linear decay to 0)
    "initial_lr": (0.0, math.inf, False),
    "weight_decay": (0.0, math.inf, False),
    "momentum": _UNIT,
    "dampening": (0.0, 1.0, True),
    "alpha": _UNIT,
    "lr_decay": (0.0, math.inf, False),
    "betas": _UNIT,
    "step": (0.0, math.inf, False),
}
_OPTIONAL_KEYS = {"initial_lr", "param_names"}  # added by a scheduler / torch's named-parameter groups


def _number(value: Any) -> float | None:
    """A real number (int, float, or a one-value float tensor), else None; bool is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if torch.is_tensor(value) and value.numel() == 1 and not value.is_complex():
        return float(value.item())
    return None


def _check_number(where: str, key: str, value: Any) -> None:
    number = _number(value)
    if number is None or not math.isfinite(number):
        raise CheckpointLoadError(f"{where}: {key} must be a finite number, got {value!r:.80}")
    if key == "eps" and not number > 0:
        raise CheckpointLoadError(f"{where}: eps must be > 0, got {number!r}")
    low, high, closed = _RANGES.get(key.split("[")[0], (-math.inf, math.inf, False))
    if not (low <= number <= high if closed else low <= number < high):
        bound = f"[{low:g}, {high:g}{']' if closed else ')'}"
        raise CheckpointLoadError(f"{where}: {key} must be in {bound}, got {number!r}")


def check_value(where: str, key: str, saved: Any, current: Any) -> None:
    """``saved`` of the kind ``current`` is (the optimizer's own value), and in range for ``key``."""
    if isinstance(current, bool) or current is None:
        if not (isinstance(saved, bool) or (current is None and saved is None)):
            raise CheckpointLoadError(f"{where}: {key} must be {'true/false' if current is not None else 'null or a bool'}, "
                                      f"got {saved!r:.80}")  # fmt: skip
    elif _number(current) is not None:
        _check_number(where, key, saved)
    elif isinstance(current, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(current):
            raise CheckpointLoadError(f"{where}: {key} must be a list of {len(current)}, got {saved!r:.80}")
        for i, (s, c) in enumerate(zip(saved, current)):
            check_value(where, f"{key}[{i}]", s, c)
    elif isinstance(current, str):
        if not isinstance(saved, str):
            raise CheckpointLoadError(f"{where}: {key} must be a string, got {saved!r:.80}")
    elif type(saved) is not type(current):
        raise CheckpointLoadError(f"{where}: {key} must be a {type(current).__name__}, got {saved!r:.80}")


def check_group_values(where: str, saved: list[Any], current: list[Mapping[str, Any]]) -> None:
    """Every saved param group holds exactly the current group's hyper-parameters, each typed and in range.

    ``saved`` has as many groups as ``current`` (the callers check that first).
    """
    for i, (group, now) in enumerate(zip(saved, current)):
        if not isinstance(group, Mapping):
            raise CheckpointLoadError(f"{where}: param_groups[{i}] must be an object, got {group!r:.80}")
        keys, known = set(group) - {"params"}, set(now) - {"params"}
        unknown, missing = sorted(map(str, keys - known - _OPTIONAL_KEYS)), sorted(known - keys - _OPTIONAL_KEYS)
        if unknown or missing:
            raise CheckpointLoadError(f"{where}: param_groups[{i}] has hyper-parameters {unknown} the optimizer "
                                      f"lacks, and lacks {missing}")  # fmt: skip
        for key in sorted(keys & known):
            check_value(f"{where}: param_groups[{i}]", key, group[key], now[key])
        if "initial_lr" in group and "initial_lr" not in now:
            _check_number(f"{where}: param_groups[{i}]", "initial_lr", group["initial_lr"])


def check_finite(where: str, named: Iterable[tuple[str, Any]]) -> None:
    """Every floating-point tensor (and float) in ``named`` finite: a forged NaN or 1e39-in-fp32 gap never loads."""
    for name, value in named:
        if torch.is_tensor(value):
            if value.is_floating_point() and value.numel() and not bool(torch.isfinite(value).all()):
                raise CheckpointLoadError(f"{where}: {name} holds NaN or inf values")
        elif isinstance(value, float) and not math.isfinite(value):
            raise CheckpointLoadError(f"{where}: {name} is {value!r}, not a finite number")


def check_state_keys(where: str, state: Any, known: Iterable[Any]) -> None:
    """Optimizer state only for parameters the optimizer has (``known``: its ids or names)."""
    if not isinstance(state, Mapping):
        raise CheckpointLoadError(f"{where}: optimizer 'state' must be a mapping, got {type(state).__name__}")
    stray = [k for k in state if k not in set(known)]
    if stray:
        raise CheckpointLoadError(f"{where}: optimizer state for parameters the optimizer does not have: {stray[:5]!r:.200}")
    for key, entry in state.items():
        if not isinstance(entry, Mapping):
            raise CheckpointLoadError(f"{where}: optimizer state of {key!r:.80} must be a mapping, got {entry!r:.80}")
        if "step" in entry:
            _check_number(f"{where}: optimizer state of {key!r:.80}", "step", entry["step"])
        check_finite(f"{where}: optimizer state of {key!r:.80}", entry.items())
