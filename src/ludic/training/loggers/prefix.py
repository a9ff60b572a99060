"""Stat-key grouping: every key lives under ``train/``, ``eval/``, ``perf/`` (migration guide §6) or ``time/``
(the step's wall time split into its parts, ``ludic.training._step_times``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

GROUPS = ("train", "eval", "perf", "time")
_PERF_PREFIXES = ("gpu_", "cpu_", "mem_", "perf_", "time_", "throughput")
_PERF_SUFFIXES = ("_mb", "_gb", "_seconds", "_sec", "_ms", "_per_s", "_per_second")


def prefix_key(key: str) -> str:
    """Auto-prefix an ungrouped key: ``loss -> train/loss``, ``eval_accuracy -> eval/accuracy``,
    ``gpu_mem_alloc_mb -> perf/gpu_mem_alloc_mb``; keys already under a group are unchanged. A key that is
    not a string (a caller's int or tuple) is named by its ``str`` rather than failing the sink."""
    key = key if isinstance(key, str) else str(key)
    head = key.split("/", 1)[0]
    if head in GROUPS and "/" in key:
        return key
    if key.startswith("eval_"):
        return f"eval/{key[len('eval_') :]}"
    if key.startswith("perf_"):
        return f"perf/{key[len('perf_') :]}"
    if key.startswith(_PERF_PREFIXES) or key.endswith(_PERF_SUFFIXES):
        return f"perf/{key}"
    return f"train/{key}"


def prefix_stats(stats: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``stats`` with every key auto-prefixed (see :func:`prefix_key`)."""
    return {prefix_key(k): v for k, v in stats.items()}


def group_by_prefix(stats: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Split stats into ``{"train": {...}, "eval": {...}, "perf": {...}}`` keyed by the unprefixed name."""
    groups: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    for key, value in prefix_stats(stats).items():
        group, name = key.split("/", 1)
        groups[group][name] = value
    return groups


def to_float(value: Any) -> Any:
    """Turn 0-d tensors and numpy scalars into Python numbers for sinks that serialise."""
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (ValueError, RuntimeError):
            return value
    return value


def as_number(value: Any) -> float | None:
    """``value`` as a float (tensors and numpy scalars included; NaN stays NaN, an int too big for a float is
    an infinity instead of ``float()``'s OverflowError), or None when it is not a number (a bool, a string)."""
    value = to_float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float, else None (not a number, NaN or an infinity: not a point on a curve)."""
    number = as_number(value)
    return number if number is not None and math.isfinite(number) else None
