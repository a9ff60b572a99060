"""The server side of vLLM's weight-transfer protocol, with a torch.distributed data plane.

``init`` joins a process group the trainer (rank 0) created at ``master_address:master_port``
(gloo on CPU, NCCL on GPU); ``start`` opens an update; ``receive`` takes one ``update_info`` and
receives its tensors from rank 0's broadcasts (one packed buffer, or one broadcast per tensor)
into staging memory, and checks it for NaN/inf on a worker thread while the next bucket arrives;
``finish`` waits for those checks and loads everything staged into the engine in one step under a
new version. Anything that fails (bad metadata, a broadcast that never arrives, NaN) discards the
staging area: the old weights keep serving at the old version.

Copies: the packed receive buffers become the model's storage at ``finish`` (``adopt``: no copy
into the model), and the buffers the model used before are received into next time, so a
steady stream of updates alternates between two sets of buffers without allocating.

Shared memory (``init_info = {"backend": "shm"}``, Ludic's own, ``ludic.inference.shared_memory``):
the same flow without a process group. The buffers are memfds; ``reserve`` hands the trainer one for
an ``update_info`` (it packs the tensors straight into it), and ``receive`` of that ``update_info``
with ``shm_buffer`` set stages what the trainer wrote.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ludic.inference.finite_check import FiniteCheck
from ludic.inference.process_group import MAX_CHANNELS, broadcast_all, create_group
from ludic.inference.shared_memory import SHARED_MEMORY_BACKEND, SharedBuffer, allocate_shared
from ludic.inference.weight_packing import TensorMeta, metas_from_update_info, packed_size, unpack
from ludic.inference.weights import next_version, non_finite_message, validate_metas, validate_state_dict


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


_SHARED_MEMORY = object()  # stands in for the process group when the data plane is shared memory


class WeightReceiver:
    """Owns the server's weight-transfer group and staging area (used from worker threads)."""

    def __init__(self, engine: Any, *, timeout_s: float = 120.0, drop_updates: bool = False) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.drop_updates = drop_updates  # fault injection for tests of the sync probe only
        self._group: Any = None
        self._channels = 1
        self._staged: dict[str, torch.Tensor] | None = None
        self._pool: list[torch.Tensor] = []  # packed receive buffers: free unless the model lives in one
        self._shared: dict[int, SharedBuffer] = {}  # the pool's shared-memory buffers, by storage pointer
        self._reserved: dict[int, tuple[list[TensorMeta], torch.Tensor]] = {}  # buffer id -> its call, this update
        self._buffer_ids = 0
        self._taken: set[int] = set()  # buffers (storage pointers) filled by this update
        self._live: set[int] = set()  # storages of the model's parameters when this update started
        # one OpenMP thread: the check runs beside the next call's transfer (FiniteCheck)
        self._checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-weight-check",
                                           initializer=torch.set_num_threads, initargs=(1,))  # fmt: skip
        self._dtypes: dict[str, torch.dtype] = {}
        self._check = FiniteCheck(self._checker)
        self._lock = threading.Lock()  # one transfer at a time
        self.timings: dict[str, float] = {}

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def shared_memory(self) -> bool:
        return self._group is _SHARED_MEMORY

    def init(self, info: InitInfo | SharedMemoryInit) -> None:
        """Join rank 0's group (blocks until it is there, up to the timeout), or switch to shared memory."""
        if isinstance(info, SharedMemoryInit):
            if self.device.type != "cpu":
                raise ValueError("the shared-memory weight transfer serves CPU engines; a GPU engine takes NCCL")
            with self._lock:
                self._group, self._staged, self._channels = _SHARED_MEMORY, None, 1
            return
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        with self._lock:
            try:
                group = create_group(info.master_address, info.master_port, info.rank_offset, info.world_size,
                                     backend=backend, timeout_s=self.timeout_s, channels=info.channels)  # fmt: skip
            except Exception as exc:
                raise TransferError(f"could not join the weight-transfer group at "
                                    f"{info.master_address}:{info.master_port}: {exc}") from exc  # fmt: skip
            self._group, self._staged, self._channels = group, None, info.channels

    def start(self) -> None:
        if self._group is None:
            raise ValueError("no weight-transfer group: POST /init_weight_transfer_engine first")
        self._staged, self._taken, self._reserved = {}, set(), {}
        target = self.engine.model.state_dict()
        self._dtypes = {name: t.dtype for name, t in target.items()}
        self._check = FiniteCheck(self._checker, self._dtypes)  # as stored: after the cast to the model's dtype
        self._live = {p.untyped_storage().data_ptr() for p in self.engine.model.parameters()}
        self.timings = {"receive_s": 0.0, "check_s": 0.0, "alloc_bytes": 0.0}

    def reserve(self, update_info: Any) -> dict[str, int]:
        """Shared memory: a free buffer for ``update_info``'s tensors, packed (``weight_packing``), named so the
        trainer can map it: ``{"buffer", "pid", "fd", "file_bytes"}``; it writes the first
        ``packed_size`` bytes and then sends the same ``update_info`` with ``shm_buffer`` set."""
        metas = metas_from_update_info(update_info)
        if not self.shared_memory or self._staged is None:
            raise ValueError("no shared-memory weight update in progress: POST /init_weight_transfer_engine with "
                             "init_info {\"backend\": \"shm\"}, then /start_weight_update")  # fmt: skip
        validate_metas(metas, self.engine.model.state_dict())
        with self._lock:
            buffer = self._buffer(packed_size(metas))
            shared = self._shared[self._ptr(buffer)]
            self._reserved[shared.buffer_id] = (metas, buffer)
        self._check.start_background()  # the calls received so far, while the trainer writes this one
        return {"buffer": shared.buffer_id, "pid": os.getpid(), "fd": shared.fd, "file_bytes": shared.nbytes}

    def receive(self, update_info: Any) -> int:
        """Receive one ``update_info``'s tensors into staging; returns how many were staged."""
        metas = metas_from_update_info(update_info)
        if self._group is None or self._staged is None:
            raise ValueError("no weight update in progress: POST /start_weight_update first")
        if self.shared_memory or "shm_buffer" in update_info:
            return self._receive_shared(metas, update_info.get("shm_buffer"))
        validate_metas(metas, self.engine.model.state_dict())
        packed = bool(update_info.get("packed", False))
        with self._lock:
            t0 = time.perf_counter()
            try:
                received = self._receive_packed(metas) if packed else self._receive_each(metas)
            except Exception as exc:
                self._staged, self._group = None, None  # a broken group cannot be reused
                raise TransferError(
                    f"weight broadcast failed ({exc}); the update was discarded, the old weights "
                    "keep serving; POST /init_weight_transfer_engine again"
                ) from exc
            self.timings["receive_s"] += time.perf_counter() - t0
            self._staged.update(received)
            self._check.add(received)
        return len(received)

    def _receive_shared(self, metas: list[TensorMeta], buffer_id: Any) -> int:
        """Stage what the trainer wrote into the buffer reserved for exactly these tensors. Anything amiss
        discards the whole update (a later finish is refused), so a partial one can never be applied."""
        with self._lock:
            try:
                if not self.shared_memory:
                    raise ValueError("update_info.shm_buffer given, but this transfer engine was initialized for a "
                                     "process group")  # fmt: skip
                if self._staged is None:
                    raise ValueError("the update was discarded after an earlier error: start a new one")
                reserved = self._reserved.pop(buffer_id, None) if isinstance(buffer_id, int) else None
                if reserved is None:
                    raise ValueError(f"shm_buffer {buffer_id!r} was not reserved in this update "
                                     "(POST /ludic/reserve_weight_buffer first; each buffer takes one call)")  # fmt: skip
                if reserved[0] != metas:
                    raise ValueError(f"shm_buffer {buffer_id}'s update_info differs from the one it was reserved for")
            except ValueError:
                self._staged = None
                raise
            received = unpack(reserved[1], metas)
            self._staged.update(received)
            self._check.add(received, background=False)  # checked while the next call is written, or at finish
        return len(received)

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        broadcast_all(self._group, tensors, timeout_s=self.timeout_s, channels=self._channels)

    def _buffer(self, size: int) -> torch.Tensor:
        """A receive buffer of ``size`` bytes that neither the model nor this update uses: the smallest
        free one that fits (best fit, so an update laid out like the last one reuses the other set exactly
        and a small call never takes the buffer a large one needs), else a new one (counted in
        ``alloc_bytes``: fresh pages fault in while the bytes arrive, which halves the receive speed)."""
        usable = [b for b in self._pool if not self.shared_memory or self._ptr(b) in self._shared]
        free = [b for b in usable if b.numel() >= size and self._ptr(b) not in self._taken | self._live]
        if free:
            buffer = min(free, key=torch.Tensor.numel)
        else:
            buffer = self._allocate(size)
            self._pool.append(buffer)
            self.timings["alloc_bytes"] += size
        self._taken.add(self._ptr(buffer))
        return buffer[:size]

    def _allocate(self, size: int) -> torch.Tensor:
        if not self.shared_memory:
            return torch.empty(size, dtype=torch.uint8, device=self.device)
        self._buffer_ids += 1
        shared = allocate_shared(size, self._buffer_ids)
        self._shared[self._ptr(shared.tensor)] = shared
        return shared.tensor

    @staticmethod
    def _ptr(buffer: torch.Tensor) -> int:
        return buffer.untyped_storage().data_ptr()

    def _receive_packed(self, metas: list[TensorMeta]) -> dict[str, torch.Tensor]:
        buffer = self._buffer(packed_size(metas))
        self._broadcast([buffer])
        return unpack(buffer, metas)

    def _receive_each(self, metas: list[TensorMeta]) -> dict[str, torch.Tensor]:
        """One broadcast per tensor, each straight into its place in a pooled buffer."""
        out = unpack(self._buffer(packed_size(metas)), metas)
        self._broadcast(list(out.values()))
        return out

    def finish(self, weight_version: Any) -> str:
        """Load everything staged in one step (validated first), as ``weight_version``."""
        staged, self._staged = self._staged, None
        if staged is None:
            raise ValueError("no weight update in progress: POST /start_weight_update first")
        if not staged:
            raise ValueError("finish_weight_update with nothing received: POST /update_weights first")
        version = None if weight_version is None else next_version(weight_version, self.engine.policy_version)
        t0 = time.perf_counter()
        bad = self._check.first_bad()
        self.timings["check_s"] = self._check.seconds
        if bad is not None:
            raise ValueError(non_finite_message(bad, staged[bad].dtype, self._dtypes[bad]))
        validate_state_dict(staged, self.engine.model.state_dict(), check_finite=False)
        t1 = time.perf_counter()
        if self.drop_updates:
            self.engine.policy_version = next_version(version, self.engine.policy_version)
            return "dropped (fault injection): version bumped, weights unchanged"
        status = self.engine.load_validated(staged, timeout_s=self.timeout_s, version=version, adopt=True)
        self.timings.update(check_wait_s=t1 - t0, load_s=time.perf_counter() - t1)
        self._prune_pool()
        return status

    def _prune_pool(self) -> None:
        """Keep the buffers this update filled, and those the model used before it (free from now on)."""
        live = {p.untyped_storage().data_ptr() for p in self.engine.model.parameters()}
        keep = self._taken | self._live | live
        self._pool = [b for b in self._pool if b.untyped_storage().data_ptr() in keep]
        for ptr in [p for p in self._shared if p not in keep]:  # the model's views keep a dropped mapping alive
            self._shared.pop(ptr).close()

