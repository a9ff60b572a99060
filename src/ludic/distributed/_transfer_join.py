"""Joining a server's weight transfer, once per publisher: a process group with the trainer as rank 0, or
Ludic's same-host shared memory. Returns the data plane and the server's ``/weight_info`` to check against."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from ludic.distributed._server_meta import server_weight_info
from ludic.distributed.shared_buffers import PeerBuffers
from ludic.inference.weight_sync.process_group import create_group
from ludic.inference.weight_sync.shared_memory import SHARED_MEMORY_BACKEND

MAX_WORLD_SIZE = 1 << 16
"""The most inference ranks a ``/get_world_size`` reply may claim (a group of that many waits for each)."""


def join_shared_memory(client: Any, timeout_s: float) -> tuple[PeerBuffers, Any]:
    """Switch Ludic's server to shared memory; the pid a buffer reservation names must listen on its port."""
    client.post_json_sync("/init_weight_transfer_engine", {"init_info": {"backend": SHARED_MEMORY_BACKEND}},
                          timeout_s=timeout_s)  # fmt: skip
    port = urlsplit(client.base_url).port or 80
    return PeerBuffers(port), server_weight_info(client, timeout_s)


def join_group(
    client: Any, pool: ThreadPoolExecutor, address: str, port: int, backend: str, timeout_s: float, channels: int
) -> tuple[Any, Any]:
    """Host the rendezvous at ``address:port`` as rank 0 (on ``pool``) while the server joins it
    (``/init_weight_transfer_engine``, vLLM's ``init_info``)."""
    world = 1 + inference_ranks(client.get_json_sync("/get_world_size", timeout_s=timeout_s))
    joining = pool.submit(create_group, address, port, 0, world, backend=backend, timeout_s=timeout_s,
                          channels=channels)  # fmt: skip
    init = {"master_address": address, "master_port": port, "rank_offset": 1, "world_size": world}
    if channels > 1:  # Ludic's own field: vLLM's documented init_info stays as it is otherwise
        init["channels"] = channels
    client.post_json_sync("/init_weight_transfer_engine", {"init_info": init}, timeout_s=timeout_s)
    return joining.result(timeout=timeout_s), server_weight_info(client, timeout_s)


def inference_ranks(reply: Any) -> int:
    """``world_size`` of a ``/get_world_size`` reply, an int in ``[1, MAX_WORLD_SIZE]``; ValueError otherwise.
    Read with ``int()``, 0 made a group of the trainer alone (every broadcast "succeeded" with nobody
    receiving), a bool or float was truncated, and inf raised OverflowError."""
    size = reply.get("world_size") if isinstance(reply, dict) else None
    if type(size) is not int or not 1 <= size <= MAX_WORLD_SIZE:
        raise ValueError(f"the server's /get_world_size reply must give world_size, its inference ranks, as an int "
                         f"in [1, {MAX_WORLD_SIZE}]; got {reply!r:.200}")  # fmt: skip
    return size
