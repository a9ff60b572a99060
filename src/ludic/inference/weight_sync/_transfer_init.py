"""What ``POST /init_weight_transfer_engine`` may say: vLLM's process-group ``init_info`` or Ludic's shared
memory, parsed and checked (``receiver`` acts on it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ludic.inference.weight_sync.process_group import MAX_CHANNELS
from ludic.inference.weight_sync.shared_memory import SHARED_MEMORY_BACKEND


class TransferError(RuntimeError):
    """The data plane failed (e.g. a broadcast did not arrive in time); the update was discarded."""


@dataclass(frozen=True)
class InitInfo:
    """vLLM's NCCL ``init_info``: where rank 0 listens and this server's place in the group; and Ludic's
    own optional ``channels`` (gloo connections the broadcasts are spread over; default 1)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    channels: int = 1

    @classmethod
    def parse(cls, info: Any) -> InitInfo:
        if not isinstance(info, dict):
            raise ValueError("init_info must be a JSON object")
        try:
            out = cls(str(info["master_address"]), int(info["master_port"]), int(info["rank_offset"]),
                      int(info["world_size"]), int(info.get("channels", 1)))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"init_info needs master_address, master_port, rank_offset, world_size: {exc!r}"
            ) from exc
        if not (0 < out.rank_offset < out.world_size) or not (0 < out.master_port < 65536):
            raise ValueError(f"init_info out of range: {out} (rank 0 is the trainer)")
        if not 1 <= out.channels <= MAX_CHANNELS:
            raise ValueError(f"init_info.channels must be from 1 to {MAX_CHANNELS}, got {out.channels}")
        return out


@dataclass(frozen=True)
class SharedMemoryInit:
    """``init_info = {"backend": "shm"}``: the trainer writes into the server's shared buffers (same host)."""


def parse_init_info(info: Any) -> InitInfo | SharedMemoryInit:
    """vLLM's NCCL-style ``init_info``, or Ludic's shared-memory one; ValueError names what is wrong."""
    backend = info.get("backend") if isinstance(info, dict) else None
    if backend is None:
        return InitInfo.parse(info)
    if backend != SHARED_MEMORY_BACKEND:
        raise ValueError(f"init_info.backend {backend!r} is not known: omit it (a process group) or use 'shm'")
    return SharedMemoryInit()
