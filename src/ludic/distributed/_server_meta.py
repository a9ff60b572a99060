"""The server's parameter names/dtypes/shapes (``GET /weight_info``), to refuse a bad tensor before any
byte of it is sent (``BroadcastPolicyPublisher``)."""

from __future__ import annotations

from typing import Any

import torch

from ludic.inference.http_client import RequestRefused
from ludic.inference.weight_sync.packing import DTYPES, TensorMeta

Expected = dict[str, tuple[str, tuple[int, ...]]]


def server_weight_info(client: Any, timeout_s: float) -> Expected | None:
    """The server's names/dtypes/shapes; None from a server without the route (it validates on its own)."""
    try:
        info = client.get_json_sync("/weight_info", timeout_s=timeout_s)
    except RequestRefused:
        return None
    return parse_weight_info(info)


def parse_weight_info(info: Any) -> Expected:
    """``/weight_info``'s JSON as ``{name: (dtype name, shape)}``; ValueError naming what is malformed. A
    reply is untrusted: read loosely, a shape ``"12"`` became ``("1", "2")``, a repeated name kept its last
    entry, and a missing field raised a bare KeyError the publisher reported as ``'names'``."""
    where = "the server's /weight_info"
    if not isinstance(info, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(info).__name__}")
    fields = [info.get(k) for k in ("names", "dtype_names", "shapes")]
    if not all(isinstance(f, list) for f in fields):
        raise ValueError(f"{where} needs lists 'names', 'dtype_names' and 'shapes', got {info!r:.200}")
    names, dtypes, shapes = fields
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"{where} has {len(names)} names, {len(dtypes)} dtype_names, {len(shapes)} shapes")
    expected: Expected = {}
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where} names a parameter {name!r:.50}: names must be non-empty strings")
        if name in expected:
            raise ValueError(f"{where} lists {name!r:.100} twice")
        if not isinstance(dtype, str) or not dtype:
            raise ValueError(f"{where} gives {name!r:.100} the dtype {dtype!r:.50}: expected a dtype name")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"{where} gives {name!r:.100} the shape {shape!r:.100}: expected ints >= 0")
        expected[name] = (dtype, tuple(shape))
    return expected


def check_against_server(metas: list[TensorMeta], expected: Expected | None) -> None:
    """ValueError naming the first tensor the server has no place for (name, shape, or float-ness)."""
    if expected is None:
        return
    for m in metas:
        if m.name not in expected:
            raise ValueError(f"publish: the server has no parameter {m.name!r}")
        dtype, shape = expected[m.name]
        if m.shape != shape:
            raise ValueError(f"publish: {m.name!r} has shape {list(m.shape)}, the server's is {list(shape)}")
        if m.dtype.is_floating_point != DTYPES.get(dtype, torch.float32).is_floating_point:
            raise ValueError(f"publish: {m.name!r} has dtype {m.dtype_name}, the server's is {dtype}")
