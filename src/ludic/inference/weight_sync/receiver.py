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

Shared memory (``init_info = {"backend": "shm"}``, Ludic's own, ``ludic.inference.weight_sync.shared_memory``):
the same flow without a process group. The shared buffers are memfds; ``reserve`` hands the trainer one
for an ``update_info`` (it packs the tensors straight into it), and ``receive`` of that ``update_info``
with ``shm_buffer`` set copies what the trainer wrote into a private receive buffer and stages that: a
shared buffer, still mapped writable by the trainer, never becomes the model's storage.

An adapter update (Ludic's own ``{"adapter": config}`` in the ``/start_weight_update`` body,
``ludic.inference.weight_sync.adapter_config``) travels the same way; its calls carry lora_A/lora_B tensors checked
against the shapes the config gives on this model, and ``finish`` serves it on top of the base
(``ludic.inference.embedded.adapters``) instead of loading it as weights.

One owner (``_update_owner``): ``start`` returns an ``update_id``; while that update is in progress
another ``start`` or ``init`` is refused, and a call naming another update is refused (shared-memory
calls must name it), so two publishers never mix into one update.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ludic.inference.weight_sync._transfer_init import (
    InitInfo,
    SharedMemoryInit,
    TransferError,
    parse_init_info,
)
from ludic.inference.weight_sync._update_owner import UpdateOwner
from ludic.inference.weight_sync.adapter_config import AdapterConfig, AdapterPayload
from ludic.inference.weight_sync.finite_check import FiniteCheck
from ludic.inference.weight_sync.packing import TensorMeta, metas_from_update_info, packed_size, unpack
from ludic.inference.weight_sync.process_group import broadcast_all, create_group
from ludic.inference.weight_sync.shared_memory import SharedPool
from ludic.inference.weight_sync.tied_names import check_aliases, with_aliases
from ludic.inference.weight_sync.weights import (
    non_finite_message,
    validate_metas,
    validate_state_dict,
)

__all__ = ["InitInfo", "SharedMemoryInit", "TransferError", "WeightReceiver", "parse_init_info"]
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
        self._shm = SharedPool()  # shared staging the trainer writes into (copied out on receive)
        self._reserved: dict[int, tuple[list[TensorMeta], torch.Tensor]] = {}  # buffer id -> its call, this update
        self.owner = UpdateOwner(timeout_s)
        self._taken: set[int] = set()  # buffers (storage pointers) filled by this update
        self._live: set[int] = set()  # storages of the model's parameters when this update started
        # one OpenMP thread: the check runs beside the next call's transfer (FiniteCheck)
        self._checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-weight-check",
                                           initializer=torch.set_num_threads, initargs=(1,))  # fmt: skip
        self._dtypes: dict[str, torch.dtype] = {}
        self._adapter: AdapterConfig | None = None  # this update carries an adapter, not weights
        self._targets: dict[str, torch.Tensor] = {}  # what this update's tensors must fit (meta tensors for adapters)
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
        self.owner.refuse_if_busy("re-initialize the weight transfer")
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

    def start(self, adapter: Any = None) -> str:
        """Open an update (``adapter``: the JSON config of a LoRA adapter update); returns its ``update_id``
        (409 while another publisher's is in progress)."""
        if self._group is None:
            raise ValueError("no weight-transfer group: POST /init_weight_transfer_engine first")
        self.owner.refuse_if_busy("start a weight update")
        config = None if adapter is None else AdapterConfig.from_json(adapter)
        target = self._update_target(config)  # a refused start changes nothing (an update it would take over goes on)
        if self.owner.update_id is not None:  # taken over: its publisher may still write where it was told to
            self._shm.retire(set(self._shm.used))
        self._staged, self._taken, self._reserved = {}, set(), {}
        self._adapter, self._targets = config, target
        self._dtypes = {name: t.dtype for name, t in target.items()}
        self._check = FiniteCheck(self._checker, self._dtypes)  # as stored: after the cast to the model's dtype
        self._live = {p.untyped_storage().data_ptr() for p in self.engine.model.parameters()}
        self.timings = {"receive_s": 0.0, "check_s": 0.0, "alloc_bytes": 0.0}
        return self.owner.open()

    def _update_target(self, config: AdapterConfig | None) -> dict[str, torch.Tensor]:
        """What the update's tensors must fit: the model's state dict, or (an adapter) meta tensors of the shapes
        its config gives on this model; refused here (400) before any byte: a layer it names that is not there,
        a rank above a layer's, a scaling out of range, another base."""
        if config is None:
            return self.engine.model.state_dict()
        metas = self.engine.adapter.expected_metas(self.engine.model, config)
        self.engine.adapter.check_base(self.engine.model, config, locked=False)  # checked again under the lock
        return {m.name: torch.empty(m.shape, dtype=m.dtype, device="meta") for m in metas}

    def abort(self, update_id: Any) -> None:
        """Discard the update ``update_id`` (its publisher failed midway): the old weights keep serving."""
        self.owner.check(update_id, required=True)
        self._discard()

    def _discard(self) -> None:
        self._staged, self._reserved = None, {}
        self.owner.close()

    def reserve(self, update_info: Any, update_id: Any = None) -> dict[str, int]:
        """Shared memory: a free buffer for ``update_info``'s tensors, packed (``packing``), named so the
        trainer can map it: ``{"buffer", "pid", "fd", "file_bytes"}``; it writes the first
        ``packed_size`` bytes and then sends the same ``update_info`` with ``shm_buffer`` set."""
        metas = metas_from_update_info(update_info)
        if not self.shared_memory or self._staged is None:
            raise ValueError("no shared-memory weight update in progress: POST /init_weight_transfer_engine with "
                             "init_info {\"backend\": \"shm\"}, then /start_weight_update")  # fmt: skip
        self.owner.check(update_id, required=True)
        with self._lock:  # what this update holds or has reserved does not change while it is checked
            reserved = (m.name for call, _ in self._reserved.values() for m in call)
            validate_metas(metas, self._targets, sent={*(self._staged or {}), *reserved})
            size = packed_size(metas)
            shared, fresh = self._shm.take(size, busy=set(self._reserved))
            self.timings["alloc_bytes"] += size if fresh else 0
            self._reserved[shared.buffer_id] = (metas, shared.tensor[:size])
        self._check.start_background()  # the calls received so far, while the trainer writes this one
        return {"buffer": shared.buffer_id, "pid": os.getpid(), "fd": shared.fd, "file_bytes": shared.nbytes}

    def receive(self, update_info: Any, update_id: Any = None) -> int:
        """Receive one ``update_info``'s tensors into staging; returns how many were staged."""
        metas = metas_from_update_info(update_info)
        if self._group is None or self._staged is None:
            raise ValueError("no weight update in progress: POST /start_weight_update first")
        self.owner.check(update_id, required=self.shared_memory)
        if self.shared_memory or "shm_buffer" in update_info:
            return self._receive_shared(metas, update_info.get("shm_buffer"))
        validate_metas(metas, self._targets, sent=self._staged)
        packed = bool(update_info.get("packed", False))
        with self._lock:
            t0 = time.perf_counter()
            try:
                received = self._receive_packed(metas) if packed else self._receive_each(metas)
            except Exception as exc:
                self._discard()
                self._group = None  # a broken group cannot be reused
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
                self._discard()
                raise
            t0 = time.perf_counter()  # out of the shared buffer (the trainer may write it again) into our own
            private = self._buffer(reserved[1].numel())
            private.copy_(reserved[1])
            self.timings["receive_s"] += time.perf_counter() - t0
            received = unpack(private, metas)
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
        free = [b for b in self._pool if b.numel() >= size and self._ptr(b) not in self._taken | self._live]
        if free:
            buffer = min(free, key=torch.Tensor.numel)
        else:
            buffer = self._allocate(size)
            self._pool.append(buffer)
            self.timings["alloc_bytes"] += size
        self._taken.add(self._ptr(buffer))
        return buffer[:size]

    def _allocate(self, size: int) -> torch.Tensor:
        return torch.empty(size, dtype=torch.uint8, device=self.device)

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

    def finish(self, weight_version: Any, update_id: Any = None, aliases: Any = None) -> str:
        """Load everything staged in one step (validated first), as ``weight_version``. ``aliases``: Ludic's own
        ``{name: name sent}`` for tied names the publisher sent once; each gets the tensor it names."""
        if self._staged is None:
            raise ValueError("no weight update in progress: POST /start_weight_update first")
        self.owner.check(update_id, required=False)
        staged = self._staged
        self._discard()  # loaded or refused, the update ends here
        if not staged:
            raise ValueError("finish_weight_update with nothing received: POST /update_weights first")
        if aliases is not None:
            staged = with_aliases(staged, check_aliases(aliases, "finish_weight_update's aliases"))
        version = None if weight_version is None else self.engine.next_version_for(weight_version)
        t0 = time.perf_counter()
        bad = self._check.first_bad()
        self.timings["check_s"] = self._check.seconds
        if bad is not None:
            raise ValueError(non_finite_message(bad, staged[bad].dtype, self._dtypes[bad]))
        validate_state_dict(staged, self._targets, check_finite=False)
        t1 = time.perf_counter()
        if self.drop_updates:
            self.engine.policy_version = self.engine.next_version_for(version)
            return "dropped (fault injection): version bumped, weights unchanged"
        if self._adapter is not None:  # its base checked again under the engine's lock, then folded in
            payload = AdapterPayload(staged, self._adapter)
            status = self.engine.sync_adapter(payload, timeout_s=self.timeout_s, version=version, checked=True)
        else:
            status = self.engine.load_validated(staged, timeout_s=self.timeout_s, version=version, adopt=True)
        self.timings.update(check_wait_s=t1 - t0, load_s=time.perf_counter() - t1)
        self._prune_pool()
        return status

    def _prune_pool(self) -> None:
        """Keep the buffers this update filled, and those the model used before it (free from now on)."""
        live = {p.untyped_storage().data_ptr() for p in self.engine.model.parameters()}
        keep = self._taken | self._live | live
        self._pool = [b for b in self._pool if b.untyped_storage().data_ptr() in keep]
        self._shm.prune()

