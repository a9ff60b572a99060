"""``BroadcastPolicyPublisher``: weights to a vLLM (or Ludic) server over a collective, controlled over HTTP.

Control plane: vLLM's weight-transfer routes (``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``), each call with a
timeout. Data plane: a process group with the trainer as rank 0 (gloo on CPU, NCCL on GPU).
Tensors travel in buckets of up to ``bucket_bytes``, each sent as (at most) two ``/update_weights``
calls: the tensors below ``pack_below_bytes`` packed into one buffer (one broadcast, not one per
small tensor), the larger ones broadcast each from its own memory (no copy; vLLM's unpacked mode).
The broadcasts and the ``/update_weights`` call run on worker threads while the next call is
packed into the other of two reused buffers (``overlap``). A dead server or a lost broadcast makes ``publish`` raise
``PublishError`` within the timeouts instead of hanging; the server then keeps its old weights.
Around the update the server is paused (``POST /pause?mode=keep`` ... ``POST /resume``, vLLM's
async-RL recipe): requests in flight freeze and continue with the new weights afterwards. Ludic's server
takes both inside the update's own calls (``pause`` on start with shm, ``resume`` on finish): two round trips less.

``backend="shm"`` (Ludic's server on the same host only): no collective; for each call the server
reserves one of its shared-memory receive buffers (``POST /ludic/reserve_weight_buffer``) and every
tensor is packed straight into it, one copy in all (``ludic.inference.weight_sync.shared_memory``).

A Mapping's tied names (one tensor under two names) go to Ludic's server once, the other names in
``/finish_weight_update``'s ``aliases``; to vLLM, each name goes (its protocol has no such field).
``publish`` takes any Mapping or iterable of ``(name, tensor)`` pairs and walks it lazily, so a
caller can gather one layer at a time (FSDP) without holding the whole model twice. Large tensors are
sent from their own memory while later ones are read, so a tensor, once yielded, must not be written
to until ``publish`` returns (yield fresh tensors, not one reused buffer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from time import perf_counter
from typing import Any

import torch
from torch import Tensor

from ludic.distributed._server_meta import check_against_server
from ludic.distributed._transfer_join import join_group, join_shared_memory
from ludic.distributed.lora_payload import check_lora_mode
from ludic.distributed.shared_buffers import PeerBuffers
from ludic.distributed.weight_buckets import WeightSource, buckets, each_tensor_once, named_tensors
from ludic.inference.vllm.client import VLLMChatClient
from ludic.inference.weight_sync.packing import TensorMeta, pack, packed_size, update_info
from ludic.inference.weight_sync.pause import check_mode
from ludic.inference.weight_sync.process_group import broadcast_all, check_channels, free_port
from ludic.inference.weight_sync.shared_memory import SHARED_MEMORY_BACKEND


def single_threaded_executor(name: str) -> ThreadPoolExecutor:
    """One worker thread whose torch ops use one OpenMP thread: packing is many small copies, and each
    parallel region costs a wake-up of every OpenMP thread, which on a busy machine can take longer than
    the copy (the per-thread setting leaves the caller's own thread count alone)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=torch.set_num_threads, initargs=(1,))


class PublishError(RuntimeError):
    """A publish did not complete; the server keeps serving its previous weights and version."""


class BroadcastPolicyPublisher:
    """PolicyPublisher over vLLM's weight-transfer API; ``client`` is a ``VLLMChatClient`` (URL, token).

    master_address/master_port: where this trainer (rank 0) hosts the rendezvous (port 0 = any free
    port); the server must reach it. backend: "gloo" or "nccl" (default: nccl when CUDA is up), or
    "shm": shared memory with Ludic's server on this host (no process group; master_* unused).
    packed: pack the tensors below ``pack_below_bytes`` (default 1 MiB; 0: none) into one buffer per
    bucket; False: one broadcast per tensor for all of them.
    pause_mode: how the server pauses during the update ("keep", "wait", "abort"; None: no pause).
    overlap: pack the next bucket while the last one is on the wire (False: one stage at a time,
    which ``bench/bench_publish.py`` uses to time each stage alone).
    channels: gloo connections each large tensor is split across (``ludic.inference.weight_sync.process_group``);
    above 1 it is sent in ``init_info`` as Ludic's own ``channels`` field, which vLLM does not document:
    keep 1 (the default) for a vLLM server. lora: what a LoRA run publishes, "merged" weights or its
    "adapter" alone (``ludic.distributed.lora_payload``; Ludic's server). ``last_stats`` holds the
    stages' seconds: ``publish_pack_s``, ``publish_wait_s`` (waiting for the wire), ``publish_control_s``
    (the control calls), and the server's own (``server_receive_s``, ``server_check_s``, ``server_load_s``...).
    """

    def __init__(
        self,
        client: Any,
        *,
        master_address: str = "127.0.0.1",
        master_port: int = 0,
        backend: str | None = None,
        bucket_bytes: int = 256 << 20,
        packed: bool = True,
        pack_below_bytes: int = 1 << 20,
        timeout_s: float = 120.0,
        pause_mode: str | None = "keep",
        overlap: bool = True,
        channels: int = 1,
        lora: str = "merged",
    ) -> None:
        if pause_mode is not None:
            check_mode(pause_mode)
        if bucket_bytes < 1 or timeout_s <= 0:
            raise ValueError(f"bucket_bytes and timeout_s must be positive, got {bucket_bytes}, {timeout_s}")
        self.client = client
        self.master_address, self.master_port = master_address, master_port
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if self.backend not in ("gloo", "nccl", SHARED_MEMORY_BACKEND):
            raise ValueError(f"backend must be 'gloo', 'nccl' or 'shm', got {self.backend!r}")
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        self.bucket_bytes, self.packed, self.timeout_s = bucket_bytes, packed, timeout_s
        self.pack_below_bytes = pack_below_bytes
        self.pause_mode, self.overlap = pause_mode, overlap
        self.lora_publish = check_lora_mode(lora)  # a peft model's trainer sends its adapter alone, or merged
        self.channels = check_channels(channels, "nccl" if self.backend == SHARED_MEMORY_BACKEND else self.backend)
        self._group: Any = None
        self._update_id: str | None = None
        self._resumed = False  # this publish's /finish_weight_update resumed the server (Ludic's)
        self._expected: dict[str, tuple[str, tuple[int, ...]]] | None = None
        self._checked = self._expected
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ludic-broadcast")
        self._packer = single_threaded_executor("ludic-pack")
        self._buffers: list[Tensor | None] = [None, None]  # packed buckets, reused from publish to publish
        self._times: dict[str, float] = {}
        self.last_stats: dict[str, float] = {}

    # ---- the PolicyPublisher seam ---------------------------------------------------------------
    def declare_restore(self, version: int) -> bool:
        """The next publish may go back to ``version`` (``VLLMChatClient.declare_restore``)."""
        return bool(self.client.declare_restore(version, timeout_s=self.timeout_s))

    def publish(self, state_dict: WeightSource, version: int | None = None) -> None:
        self._ensure_group()
        self._times = dict.fromkeys(("publish_pack_s", "publish_wait_s", "publish_control_s"), 0.0)
        self._resumed = False
        if self.pause_mode is not None and self.backend != SHARED_MEMORY_BACKEND:  # shm: in /start_weight_update
            try:
                self._control(VLLMChatClient.pause_path(self.pause_mode, True))
            except Exception as exc:
                self._reset()  # the server may come back as a new process: join it afresh next time
                raise PublishError(f"could not pause the server before the update (nothing was sent): {exc}") from exc
        try:
            self._update(state_dict, version)
        finally:  # resumed whether or not the update applied: a stuck pause would stall every rollout
            if self.pause_mode is not None and not self._resumed:  # (Ludic's server resumes on finish itself)
                self._resume()

    def _resume(self) -> None:
        try:
            t0 = perf_counter()
            self.client.post_json_sync("/resume", {}, timeout_s=self.timeout_s, retry=True)
            self._times["publish_control_s"] += perf_counter() - t0
            self.last_stats.update(self._times)
        except Exception as exc:
            raise PublishError(f"the server did not resume after the update and may stay paused: {exc}") from exc

    def _update(self, state_dict: WeightSource, version: int | None) -> None:
        count = nbytes = 0
        aliases: dict[str, str] = {}  # {tied name: the name its tensor was sent under}
        try:
            adapter = getattr(state_dict, "config", None)  # an AdapterPayload: Ludic's server serves it on the base
            body = {} if adapter is None else {"adapter": adapter.to_json()}
            if self.pause_mode is not None and self.backend == SHARED_MEMORY_BACKEND:  # Ludic's: one call less
                body["pause"] = self.pause_mode
            started = self._control("/start_weight_update", body)
            self._checked = None if adapter is not None else self._expected  # adapter names: the server checks
            self._update_id = started.get("update_id")  # Ludic's server: every call of this update names it
            in_flight: list[Future] | None = None
            pairs = named_tensors(state_dict)
            if self._update_id is not None and isinstance(state_dict, Mapping):  # Ludic's server: tied names go once
                pairs = each_tensor_once(pairs, aliases)  # (vLLM's protocol has no field for them: each name goes)
            calls = (c for b in buckets(pairs, self.bucket_bytes) for c in self._split(b))
            for i, (call, packed) in enumerate(calls):
                payload, info = self._lay_out(call, packed, slot=i % 2 if self.overlap else 0)
                if in_flight is not None:  # call i was laid out while call i-1 was on the wire
                    self._wait(in_flight)
                in_flight = self._send(payload, info)
                if not self.overlap:
                    self._wait(in_flight)
                    in_flight = None
                count += len(call)
                nbytes += sum(t.numel() * t.element_size() for _, t in call)
            if in_flight is not None:
                self._wait(in_flight)
            if count == 0:
                raise ValueError("publish got no tensors")
            if isinstance(self._group, PeerBuffers):
                self._group.end_publish()
        except Exception as exc:
            self._abort()
            self._reset()  # a collective that stopped midway cannot be trusted again
            if isinstance(exc, PublishError):
                raise
            raise PublishError(f"weight publish failed, the server keeps its old weights: {exc}") from exc
        try:  # every byte arrived: the server validates and applies all of it, or none
            body = {"weight_version": None if version is None else str(version)}
            body |= {"aliases": aliases} if aliases else {}
            if self.pause_mode is not None and self._update_id is not None:  # Ludic's server resumes after it
                body["resume"] = True
            reply = self._control("/finish_weight_update", self._owned(body))
            self._resumed = reply.get("resumed") is True
        except Exception as exc:
            raise PublishError(f"the server did not apply the update (old weights keep serving): {exc}") from exc
        server = {f"server_{k}": float(v) for k, v in (reply.get("timings") or {}).items()}
        self.last_stats = {"publish_tensors": float(count), "publish_bytes": float(nbytes),
                           "publish_tied_names": float(len(aliases)), **self._times, **server}  # fmt: skip

    def _owned(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` naming this publisher's update (when the server gave it an id: Ludic's does, vLLM's not)."""
        return body if self._update_id is None else body | {"update_id": self._update_id}

    def _abort(self) -> None:
        """Best effort: end our half-sent update on the server now, so our next ``start`` is not refused."""
        if self._update_id is not None:
            with contextlib.suppress(Exception):
                self._post("/ludic/abort_weight_update", {"update_id": self._update_id})

    def _reset(self) -> None:
        self._group = None
        self._pool.shutdown(wait=False, cancel_futures=True)  # a stuck broadcast ends at its own timeout
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ludic-broadcast")

    # ---- set-up ---------------------------------------------------------------------------------
    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.client.post_json_sync(path, body, timeout_s=self.timeout_s)

    def _control(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        t0 = perf_counter()
        try:
            return self._post(path, body or {})
        finally:
            self._times["publish_control_s"] = self._times.get("publish_control_s", 0.0) + perf_counter() - t0

    def _ensure_group(self) -> None:
        if self._group is not None:
            return
        shm = self.backend == SHARED_MEMORY_BACKEND
        port = 0 if shm else self.master_port or free_port(self.master_address)
        try:
            if shm:
                self._group, self._expected = join_shared_memory(self.client, self.timeout_s)
            else:
                self._group, self._expected = join_group(self.client, self._pool, self.master_address, port,
                                                         self.backend, self.timeout_s, self.channels)  # fmt: skip
        except Exception as exc:
            self._reset()
            where = "shared-memory weight transfer" if shm else f"weight-transfer group (port {port})"
            raise PublishError(f"could not set up the {where}: {exc}") from exc

    # ---- data plane -----------------------------------------------------------------------------
    def _split(self, bucket: list[tuple[str, Tensor]]) -> Iterator[tuple[list[tuple[str, Tensor]], bool]]:
        """The bucket as ``(tensors, packed)`` calls: the small tensors packed, the large ones as they are."""
        if self.backend == SHARED_MEMORY_BACKEND:  # every tensor is copied into the server's buffer once anyway
            yield bucket, True
            return
        limit = self.pack_below_bytes if self.packed else 0
        small = [(n, t) for n, t in bucket if t.numel() * t.element_size() < limit]
        large = [(n, t) for n, t in bucket if t.numel() * t.element_size() >= limit]
        yield from ((call, packed) for call, packed in ((small, True), (large, False)) if call)

    def _lay_out(
        self, bucket: list[tuple[str, Tensor]], packed: bool, slot: int
    ) -> tuple[list[Tensor], dict[str, Any]]:
        """The call checked and laid out: what to broadcast (one packed buffer, reused, or the tensors; shm:
        nothing, the tensors are packed into the server's buffer) and its ``update_info``."""
        t0 = perf_counter()
        metas = [TensorMeta.of(name, t) for name, t in bucket]
        try:
            check_against_server(metas, self._checked)
        except ValueError as exc:
            raise PublishError(f"{exc}; nothing of this update was applied") from exc
        info = update_info(metas, packed=packed)
        tensors = [t.detach().to(self.device) for _, t in bucket]
        if isinstance(self._group, PeerBuffers):
            self._times["publish_pack_s"] += perf_counter() - t0
            reservation = self._control("/ludic/reserve_weight_buffer", self._owned({"update_info": info}))
            t0 = perf_counter()
            view = self._group.view(reservation, packed_size(metas))
            self._packer.submit(pack, tensors, self.device, out=view).result()
            self._times["publish_pack_s"] += perf_counter() - t0
            return [], info | {"shm_buffer": reservation["buffer"]}
        if packed:
            size, buffer = packed_size(metas), self._buffers[slot]
            if buffer is None or buffer.numel() < size:
                buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
                self._buffers[slot] = buffer
            payload = [self._packer.submit(pack, tensors, self.device, out=buffer).result()]
        else:
            payload = [t.contiguous() for t in tensors]
        self._times["publish_pack_s"] += perf_counter() - t0
        return payload, info

    def _send(self, payload: list[Tensor], info: dict[str, Any]) -> list[Future]:
        """Tell the server to receive the call and broadcast ``payload`` (nothing to broadcast with shared
        memory), both on worker threads; the ``/update_weights`` call's future first."""
        posting = self._pool.submit(self._post, "/update_weights", self._owned({"update_info": info}))
        return [posting, self._pool.submit(self._broadcast_all, payload)] if payload else [posting]

    def _wait(self, in_flight: list[Future]) -> None:
        t0 = perf_counter()
        try:
            for done in in_flight:  # the post first: a refusal raises there, before the broadcast's own timeout
                done.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise PublishError(f"the weight broadcast did not complete within {self.timeout_s}s") from None
        finally:
            self._times["publish_wait_s"] += perf_counter() - t0

    def _broadcast_all(self, tensors: list[Tensor]) -> None:
        broadcast_all(self._group, tensors, timeout_s=self.timeout_s, channels=self.channels)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._packer.shutdown(wait=False)
        self._group = None
