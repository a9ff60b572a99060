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
    return {n: (d, tuple(s)) for n, d, s in zip(info["names"], info["dtype_names"], info["shapes"], strict=True)}


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
