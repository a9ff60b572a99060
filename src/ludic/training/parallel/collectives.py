"""Small collectives over the default process group that carry JSON, never pickles.

``torch.distributed``'s ``*_object`` collectives pickle; these send UTF-8 JSON as ``uint8`` tensors,
so a rank only ever decodes plain data. Tensors live on the backend's device (CUDA for NCCL). Each runs in
``collective_timeout.named_collective`` (``what``: its name; a caller's own ``named_collective`` around it
names it instead), so a timeout or a dead peer fails it with the collective and the peer named.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from ludic.training.parallel.collective_timeout import named_collective


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


def broadcast_json(obj: Any = None, *, src: int = 0, what: str = "broadcast of JSON") -> Any:
    """Rank ``src`` sends ``obj`` (JSON-serialisable); every rank returns it."""
    with named_collective(f"{what} from rank {src}", peer_rank=src if dist.get_rank() != src else None):
        return _broadcast_json(obj, src)


def _broadcast_json(obj: Any, src: int) -> Any:
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


def all_gather_json(obj: Any, *, what: str = "all-gather of JSON") -> list[Any]:
    """Every rank contributes ``obj``; every rank returns the list of all of them, by rank."""
    with named_collective(what):
        return _all_gather_json(obj)


def _all_gather_json(obj: Any) -> list[Any]:
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


def all_reduce_tensor(t: torch.Tensor, op: str = "sum", *, what: str = "all-reduce") -> torch.Tensor:
    """A reduced copy of ``t`` (``op`` in sum/max/min), on ``t``'s original device."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if op not in ops:
        raise ValueError(f"all_reduce_tensor op must be one of {sorted(ops)}, got {op!r}")
    out = t.detach().to(comm_device(), copy=True)
    with named_collective(f"{what} ({op})"):
        dist.all_reduce(out, op=ops[op])
    return out.to(t.device)
