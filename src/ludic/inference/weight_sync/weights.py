"""Checking a (partial) state dict against a model before any of it is copied."""

from __future__ import annotations

import functools
import re
from collections.abc import Container, Mapping, Sequence
from typing import Any

import torch

from ludic.inference.weight_sync.packing import TensorMeta, dtype_name


def validate_state_dict(
    params: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor], *, check_finite: bool = True
) -> None:
    """Every name known, every shape equal, float where the model is float, no NaN/inf once cast to the
    model's dtype (unless the caller checked that already: ``check_finite=False``); else raise naming it."""
    if not params:
        raise ValueError("sync_weights got an empty state dict")
    unknown = [k for k in params if k not in target]
    if unknown:
        raise KeyError(
            f"sync_weights: unknown parameter names {unknown[:5]} (model has e.g. {list(target)[:3]})"
        )
    for name, tensor in params.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"sync_weights: {name!r} is a {type(tensor).__name__}, expected a torch.Tensor"
            )
        if tuple(tensor.shape) != tuple(target[name].shape):
            raise ValueError(
                f"sync_weights: {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target[name].shape)}"
            )
        if tensor.is_floating_point() != target[name].is_floating_point():
            raise TypeError(
                f"sync_weights: {name!r} has dtype {tensor.dtype}, expected {target[name].dtype} "
                "(floating-point casts such as bfloat16 -> float32 are fine)"
            )
    if check_finite:
        dtypes = {name: target[name].dtype for name in params}
        if (bad := first_non_finite(params, dtypes)) is not None:
            raise ValueError(non_finite_message(bad, params[bad].dtype, dtypes[bad]))


def non_finite_message(name: str, sent: torch.dtype, model: torch.dtype) -> str:
    """The refusal of a NaN/inf update, naming the tensor and (when they differ) both dtypes."""
    cast = "" if sent == model else f" once cast from {dtype_name(sent)} to the model's {dtype_name(model)}"
    return f"sync_weights: {name!r} contains NaN or inf values{cast}; the update was refused, the old weights keep serving"


def first_non_finite(
    params: Mapping[str, torch.Tensor], dtypes: Mapping[str, torch.dtype] | None = None
) -> str | None:
    """The first floating-point tensor holding a NaN or inf, by name, or None. ``dtypes``: each tensor's
    target dtype; a value finite as sent but out of the target's range (1e300 -> float32, 7e4 -> float16)
    becomes inf in the cast, so it counts as inf."""
    known = _finite_together(params, dtypes)
    for name, tensor in params.items():
        dtype = dtypes.get(name) if dtypes is not None else None
        if name not in known and tensor.is_floating_point() and tensor.numel() and not finite_as(tensor, dtype):
            return name
    return None


SMALL_ELEMENTS = 1 << 16  # tensors up to this size are checked together: one call per tensor costs ~10 us


def _finite_together(params: Mapping[str, torch.Tensor], dtypes: Mapping[str, torch.dtype] | None) -> set[str]:
    """The small float tensors (a LoRA adapter's 112 of 12k values) proved finite together, by dtype and
    device: their sums stacked and summed (a NaN/inf anywhere makes it non-finite; no tensor-sized copy,
    whose fresh pages cost more than the check); those a cast could overflow, and any group whose total is
    not finite, are left to the tensor-by-tensor check, which names the first bad one."""
    groups: dict[tuple[torch.dtype, torch.device], list[str]] = {}
    for name, tensor in params.items():
        target = dtypes.get(name) if dtypes is not None else None
        if tensor.is_floating_point() and 0 < tensor.numel() <= SMALL_ELEMENTS and not _narrows(tensor.dtype, target):
            groups.setdefault((tensor.dtype, tensor.device), []).append(name)
    known: set[str] = set()
    for names in groups.values():
        if len(names) > 1 and bool(torch.isfinite(torch.stack([params[n].detach().sum() for n in names]).sum())):
            known.update(names)
    return known


@functools.cache  # finfo is slow to build; a few dtype pairs ever occur
def _narrows(source: torch.dtype, target: torch.dtype | None) -> bool:
    return target is not None and target.is_floating_point and torch.finfo(target).max < torch.finfo(source).max


def finite_as(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    """No NaN/inf in ``tensor``, nor once cast to ``dtype``. A cast is monotonic, so when the extremes
    survive it every value does; a target at least as wide as the source (or not a float) cannot overflow."""
    if not _finite(tensor):
        return False
    if not _narrows(tensor.dtype, dtype):  # a target at least as wide (or not a float) cannot overflow
        return True
    low, high = torch.aminmax(tensor.detach())
    return bool(torch.isfinite(torch.stack([low, high]).to(dtype)).all())


def validate_metas(metas: Sequence[TensorMeta], target: Mapping[str, torch.Tensor], sent: Container[str] = ()) -> None:
    """Announced names/dtypes/shapes (before any bytes arrive) against the model; ValueError names the first bad one.

    ``sent``: the names this update already received (or reserved): each tensor comes once per update, so a
    publisher cannot take a receive buffer per repeat (memory without bound) nor leave the value to arrival order."""
    for m in metas:
        if m.name in sent:
            raise ValueError(f"{m.name!r} was already sent in this weight update (each tensor is sent once per update)")
        if m.name not in target:
            raise ValueError(f"unknown parameter name {m.name!r} (model has e.g. {list(target)[:3]})")
        want = target[m.name]
        if tuple(m.shape) != tuple(want.shape):
            raise ValueError(f"{m.name!r} has shape {list(m.shape)}, expected {list(want.shape)}")
        if m.dtype.is_floating_point != want.is_floating_point():
            raise ValueError(f"{m.name!r} has dtype {m.dtype_name}, expected {dtype_name(want.dtype)}")


def assign_weights(model: torch.nn.Module, params: Mapping[str, torch.Tensor], *, adopt: bool = False) -> None:
    """Copy ``params`` (already validated) into ``model``, cast to each target's dtype and device. With
    ``adopt``, a parameter whose dtype and device match takes the tensor itself as its data: no copy."""
    owners = dict(model.named_parameters(remove_duplicate=False))
    target = model.state_dict()
    for name, tensor in params.items():
        owner = owners.get(name)
        if adopt and owner is not None and tensor.dtype == owner.dtype and tensor.device == owner.device:
            owner.data = tensor.detach()
        else:  # into the parameter itself: a tied twin adopted just before has moved its storage
            dest = owner if owner is not None else target[name]
            dest.copy_(tensor.detach().to(dest.device, dest.dtype))


MAX_VERSION = 2**63 - 1  # policy versions are int64 (Redis stream fields, tensors, vLLM's own counters)
_DECIMAL = re.compile(r"-?[0-9]+")  # a version as a string: ASCII digits (a "-" then refused as out of range)


def parse_version(value: Any) -> int:
    """A weight version as sent (an int, or its decimal string: vLLM sends ``weight_version`` as a string):
    an integer from 0 to 2**63-1, else ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"weight version {value!r:.50} is not an integer (Ludic's policy versions are ints)")
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):  # int() also takes " 8", "+8", "8_0", "٨"
        raise ValueError(f"weight version {value!r:.50} is not a decimal integer (ASCII digits only, as written)")
    if isinstance(value, str) and value.startswith("-"):  # "-0" too: a sign is not a version
        raise ValueError(f"weight version {value[:30]} is out of range: versions are int64 from 0 to {MAX_VERSION}")
    if isinstance(value, str) and len(value) > 100:  # never int() of a 1 MB string
        raise ValueError(f"weight version {value[:30]}... ({len(value)} digits) is out of range: versions are int64")
    version = int(value)
    if not 0 <= version <= MAX_VERSION:
        raise ValueError(f"weight version {version} is out of range: versions are int64 from 0 to {MAX_VERSION}")
    return version


def next_version(requested: int | None, current: int) -> int:
    """The version an update gets: ``requested`` (not below ``current``: versions never go backwards, so a
    token's label orders it against every other) or ``current + 1``; ValueError naming both otherwise."""
    version = current + 1 if requested is None else parse_version(requested)
    if version < current:
        raise ValueError(f"weight version {version} is below the served policy_version {current}: versions must "
                         "not go backwards (restart the server, or publish from the version it serves)")  # fmt: skip
    if version > MAX_VERSION:
        raise ValueError(f"weight version {version} is out of range: versions are int64 up to {MAX_VERSION}")
    return version


def weight_info(model: torch.nn.Module) -> dict[str, list]:
    """``names``/``dtype_names``/``shapes`` of every tensor in ``model.state_dict()`` (the /weight_info route)."""
    state = model.state_dict()
    return {
        "names": list(state),
        "dtype_names": [dtype_name(t.dtype) for t in state.values()],
        "shapes": [list(t.shape) for t in state.values()],
    }


def _finite(tensor: torch.Tensor) -> bool:
    """No NaN/inf. A NaN or inf element makes the sum NaN or inf, so a finite sum proves every element finite
    (one streaming pass, ~1.4x an aminmax's speed, no tensor-sized mask); a sum that is not finite may
    also be an overflow of large finite values, so min and max (NaN propagates into both) decide then."""
    tensor = tensor.detach()
    if torch.isfinite(tensor.sum()):
        return True
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low) & torch.isfinite(high))
