"""Small collectives over the default process group that carry JSON, never pickles.

``torch.distributed``'s ``*_object`` collectives pickle; these send UTF-8 JSON as ``uint8`` tensors,
so a rank only ever decodes plain data. Tensors live on the backend's device (CUDA for NCCL).
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist


def comm_device() -> torch.device:
    """Where collective tensors must live: this rank's GPU for NCCL, the CPU otherwise."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _encode(obj: Any) -> torch.Tensor:
    try:
        data = json.dumps(obj, allow_nan=True, separators=(",", ":")).encode("utf-8")
    except TypeError as exc:
        raise TypeError(f"cannot send this between ranks as JSON ({exc}); keep meta JSON-serialisable") from exc
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def _decode(t: torch.Tensor) -> Any:
    return json.loads(bytes(t.cpu().tolist()).decode("utf-8"))


def broadcast_json(obj: Any = None, *, src: int = 0) -> Any:
    """Rank ``src`` sends ``obj`` (JSON-serialisable); every rank returns it."""
    device = comm_device()
    if dist.get_rank() == src:
        payload = _encode(obj).to(device)
        size = torch.tensor([payload.numel()], dtype=torch.long, device=device)
    else:
        size = torch.zeros(1, dtype=torch.long, device=device)
    dist.broadcast(size, src=src)
    if dist.get_rank() != src:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=src)
    return obj if dist.get_rank() == src else _decode(payload)


def all_gather_json(obj: Any) -> list[Any]:
    """Every rank contributes ``obj``; every rank returns the list of all of them, by rank."""
    device = comm_device()
    payload = _encode(obj).to(device)
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([payload.numel()], dtype=torch.long, device=device))
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    chunks = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(chunks, padded)
    return [_decode(c[: int(s.item())]) for c, s in zip(chunks, sizes)]


def all_reduce_tensor(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """A reduced copy of ``t`` (``op`` in sum/max/min), on ``t``'s original device."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if op not in ops:
        raise ValueError(f"all_reduce_tensor op must be one of {sorted(ops)}, got {op!r}")
    out = t.detach().to(comm_device(), copy=True)
    dist.all_reduce(out, op=ops[op])
    return out.to(t.device)
