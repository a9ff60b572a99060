"""Property-based tests of a sharded checkpoint's untrusted parts (issue 37): ``shards.json`` and the shard
headers (each shard's ``DCP_SHARDING_INFO`` offsets), drawn by hypothesis from a real checkpoint written by
``save_shards`` and then changed the way a forger would.

Invariant: ``check_shards`` (then ``read_shards``) either raises :class:`CheckpointLoadError` naming the file,
or accepts, and then the checkpoint was well formed (shards an exact partition of every tensor, every
hyper-parameter typed and in range, no unknown state) and the values read are exactly the ones saved. Never
another exception, and each check returns within a bound.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save_file

from ludic.training.checkpoint.manager import CheckpointLoadError
from ludic.training.parallel._sharded_io import (
    MANIFEST,
    check_shards,
    read_shards,
    save_shards,
    write_manifest,
)

SHAPE = (4, 6)
BOUND_S = 5.0  # one check (or read) of these few-KB files; a hang fails the property
PLAIN = {"state": {}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.0,
                                        "amsgrad": False, "foreach": None, "params": ["w"]}]}  # fmt: skip


def expected() -> dict[str, torch.Tensor]:
    return {"model/w": torch.arange(24, dtype=torch.float32).reshape(SHAPE) + 0.5, "optim/w/exp_avg": torch.ones(3)}


def write(folder: Path, boxes: list[tuple[list[int], list[int]]], info: dict[int, Any]) -> None:
    """A checkpoint whose ``model/w`` is saved as one shard file per box (its values the saved tensor's there);
    ``info[i]`` replaces box ``i``'s sharding info in its header (a forger's JSON)."""
    tensors = expected()
    save_shards(folder, tensors)
    for p in folder.glob("*.safetensors"):
        p.unlink()
    w = tensors["model/w"]
    for i, (offsets, sizes) in enumerate(boxes):
        part = w[offsets[0] : offsets[0] + sizes[0], offsets[1] : offsets[1] + sizes[1]].contiguous()
        sharding = {"model/w": info.get(i, {"saved_offsets": offsets})}
        shard = {"model/w": part}
        if i == 0:
            shard["optim/w/exp_avg"], sharding["optim/w/exp_avg"] = tensors["optim/w/exp_avg"], {"saved_offsets": [0]}
        save_file(shard, str(folder / f"shard-{i + 1:05d}-model-00001-of-00001.safetensors"),
                  metadata={"DCP_SHARDING_INFO": json.dumps(sharding), "DCP_VERSION": "1.0", "format": "pt"})  # fmt: skip
    write_manifest(folder, tensors, json.loads(json.dumps(PLAIN)))


def is_partition(boxes: list[tuple[list[int], list[int]]]) -> bool:
    """Whether the boxes (as written: a slice past the end is cut short) cover every value exactly once."""
    count = np.zeros(SHAPE, dtype=int)
    for offsets, sizes in boxes:
        if any(o + s > n for o, s, n in zip(offsets, sizes, SHAPE)):
            return False
        count[offsets[0] : offsets[0] + sizes[0], offsets[1] : offsets[1] + sizes[1]] += 1
    return bool((count == 1).all())


def timed(fn: Any, *args: Any) -> Any:
    start = time.monotonic()
    try:
        return fn(*args)
    finally:
        assert time.monotonic() - start < BOUND_S


BOX = st.tuples(st.lists(st.integers(0, 6), min_size=2, max_size=2), st.lists(st.integers(0, 7), min_size=2, max_size=2))
JSON_ATOMS = st.one_of(st.none(), st.booleans(), st.integers(-(2**66), 2**66), st.floats(allow_nan=True), st.text(max_size=6))
JSON_VALUES = st.recursive(JSON_ATOMS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                           max_leaves=5)  # fmt: skip


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[tuple[list[int], list[int]]], dict[int, Any]]:
    """Boxes near a partition (a row split, then nudged) or anywhere; sometimes a forged sharding info."""
    if draw(st.booleans()):
        cut = draw(st.integers(0, 4))
        boxes = [([0, 0], [cut, 6]), ([cut, 0], [4 - cut, 6])]
        for _ in range(draw(st.integers(0, 2))):
            i, dim, delta = draw(st.integers(0, 1)), draw(st.integers(0, 1)), draw(st.integers(-2, 2))
            part = draw(st.sampled_from(["offset", "size"]))
            (boxes[i][0] if part == "offset" else boxes[i][1])[dim] = max(0, boxes[i][0 if part == "offset" else 1][dim] + delta)
    else:
        boxes = [(list(o), list(s)) for o, s in draw(st.lists(BOX, min_size=1, max_size=4))]
    info = draw(st.dictionaries(st.integers(0, 3), JSON_VALUES | JSON_VALUES.map(lambda v: {"saved_offsets": v}), max_size=1))
    return boxes, info


@given(layouts())
def test_shard_headers_are_refused_or_read_back_exactly(layout):
    boxes, info = layout
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write(folder, boxes, info)
        try:
            timed(check_shards, folder, expected(), PLAIN)
            loaded = timed(read_shards, folder, expected())
        except CheckpointLoadError as exc:
            assert str(folder) in str(exc)
            return
    written = [(o, [min(s, n - o_) for s, n, o_ in zip(s, SHAPE, o)]) for o, s in boxes]  # slices cut at the end
    assert not info or all(v == {"saved_offsets": boxes[i][0]} for i, v in info.items() if i < len(boxes))
    assert is_partition(written), boxes
    assert all(torch.equal(loaded[k], v) for k, v in expected().items())


PATHS = [("format",), ("files",), ("tensors",), ("tensors", "model/w"), ("tensors", "model/w", "shape"),
         ("tensors", "model/w", "dtype"), ("tensors", "optim/w/exp_avg", "shape"), ("optimizer",),
         ("optimizer", "param_groups"), ("optimizer", "state"), ("optimizer", "state", "w"),
         ("optimizer", "param_groups", 0), ("optimizer", "param_groups", 0, "params")]  # fmt: skip
PATHS += [("optimizer", "param_groups", 0, k) for k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "foreach", "new")]
PATHS += [("optimizer", "param_groups", 0, "betas", i) for i in (0, 1)]
VALUES = JSON_VALUES | st.sampled_from([0.0, 1.0, 0.999, 1e-8, -1e-8, 1e30, [0.9, 0.99], [24], [4, 6], "F32", "BF16", ["w"], {}, []])


def set_path(obj: Any, path: tuple, value: Any, delete: bool) -> None:
    for key in path[:-1]:
        obj = obj[key] if (isinstance(obj, dict) and key in obj) or (isinstance(obj, list) and isinstance(key, int) and key < len(obj)) else None
        if obj is None:
            return
    if isinstance(obj, dict) or (isinstance(obj, list) and isinstance(path[-1], int) and path[-1] < len(obj)):
        if delete and isinstance(obj, dict):
            obj.pop(path[-1], None)
        else:
            obj[path[-1]] = json.loads(json.dumps(value))  # a copy: one drawn list set at two paths is no cycle


def group_well_formed(group: Any) -> bool:
    real = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
    return (isinstance(group, dict) and set(group) == set(PLAIN["param_groups"][0]) and group["params"] == ["w"]
            and real(group["lr"]) and group["lr"] >= 0 and isinstance(group["betas"], list) and len(group["betas"]) == 2
            and all(real(b) and 0 <= b < 1 for b in group["betas"]) and real(group["eps"]) and group["eps"] > 0
            and real(group["weight_decay"]) and group["weight_decay"] >= 0 and isinstance(group["amsgrad"], bool)
            and (group["foreach"] is None or isinstance(group["foreach"], bool)))  # fmt: skip


@given(st.lists(st.tuples(st.sampled_from(PATHS), VALUES, st.booleans()), min_size=1, max_size=3))
def test_shards_json_is_refused_or_read_back_exactly(changes):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write(folder, [([0, 0], [2, 6]), ([2, 0], [2, 6])], {})
        manifest = json.loads((folder / MANIFEST).read_text())
        original = json.loads(json.dumps(manifest))
        for path, value, delete in changes:
            set_path(manifest, path, value, delete)
        (folder / MANIFEST).write_text(json.dumps(manifest))
        try:
            accepted = timed(check_shards, folder, expected(), PLAIN)
            loaded = timed(read_shards, folder, expected())
        except CheckpointLoadError as exc:
            assert str(folder) in str(exc)
            return
    assert {k: accepted[k] for k in ("format", "files", "tensors")} == {k: original[k] for k in ("format", "files", "tensors")}
    assert accepted["optimizer"]["state"] == {}
    assert all(group_well_formed(g) for g in accepted["optimizer"]["param_groups"]), accepted["optimizer"]
    assert all(torch.equal(loaded[k], v) for k, v in expected().items())
