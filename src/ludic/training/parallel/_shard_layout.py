"""Where a sharded checkpoint's values lie: ``shards.json``'s tensor specs and the shards' offsets, checked whole.

DCP copies each shard to its offsets in a buffer made by ``torch.empty_like``; a value no shard covers keeps
whatever that memory held. Sizes adding up is not enough (``[0,64)``, ``[32,64)``, ``[96,128)`` of 128 values
add up to 128 and leave ``[64,96)`` uncovered), so the shards of each tensor must lie inside it, be pairwise
disjoint and add up to all of it: disjoint boxes inside a box whose volumes sum to its volume cover it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ludic.training.checkpoint._io import CheckpointLoadError

Chunk = tuple[list[int], list[int], str]  # (offsets, sizes, safetensors dtype) of one shard
MAX_CHUNKS = 4096  # shards of one tensor (one per rank that holds part of it); the disjointness check is quadratic


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_specs(where: Path, specs: Any) -> dict[str, tuple[list[int], str]]:
    """``shards.json``'s ``tensors``: ``{key: {"shape": [ints >= 0], "dtype": str}}``, else the error naming the key."""
    if not isinstance(specs, dict):
        raise CheckpointLoadError(f"{where}: 'tensors' must be a JSON object, got {type(specs).__name__}")
    parsed = {}
    for key, spec in specs.items():
        shape = spec.get("shape") if isinstance(spec, dict) else None
        dtype = spec.get("dtype") if isinstance(spec, dict) else None
        if not isinstance(shape, list) or not all(_is_index(n) for n in shape) or not isinstance(dtype, str):
            raise CheckpointLoadError(f"{where}: tensors[{key!r:.120}] must be an object with 'shape' (a list of ints "
                                      f">= 0) and 'dtype' (a string), got {spec!r:.120}")  # fmt: skip
        parsed[key] = (shape, dtype)
    return parsed


def _overlap(a: Chunk, b: Chunk) -> bool:
    """Whether two shards share a value (boxes overlap in every dimension; an empty box overlaps nothing)."""
    return all(oa < ob + sb and ob < oa + sa for oa, sa, ob, sb in zip(a[0], a[1], b[0], b[1]))


def check_coverage(folder: Path, specs: dict[str, tuple[list[int], str]], chunks: dict[str, list[Chunk]]) -> None:
    """Every tensor's shards lie inside it, have its dtype, do not overlap and cover all of it."""
    for key, (shape, dtype) in specs.items():
        found = chunks.get(key, [])
        if len(found) > MAX_CHUNKS:
            raise CheckpointLoadError(f"{folder}: {key} has {len(found)} shards, more than {MAX_CHUNKS}")
        for offsets, size, chunk_dtype in found:
            inside = (
                isinstance(offsets, list) and all(_is_index(o) for o in offsets) and len(offsets) == len(size) == len(shape)
                and all(o + s <= n for o, s, n in zip(offsets, size, shape))
            )  # fmt: skip
            if not inside or chunk_dtype != dtype:
                raise CheckpointLoadError(f"{folder}: a shard of {key} ({size} at {offsets!r:.80}, {chunk_dtype}) "
                                          f"does not fit its shape {shape} / dtype {dtype}")  # fmt: skip
        live = [c for c in found if math.prod(c[1])]
        for i, a in enumerate(live):
            for b in live[i + 1 :]:
                if _overlap(a, b):
                    raise CheckpointLoadError(f"{folder}: shards of {key} overlap ({a[1]} at {a[0]} and {b[1]} at {b[0]})")
        covered = sum(math.prod(c[1]) for c in live)
        if covered != math.prod(shape):
            raise CheckpointLoadError(f"{folder}: shards of {key} hold {covered} of {math.prod(shape)} values "
                                      "(some values are in no shard)")  # fmt: skip
    stray = sorted(set(chunks) - set(specs))
    if stray:
        raise CheckpointLoadError(f"{folder}: shards hold tensors the manifest does not list: {stray[:5]}")
