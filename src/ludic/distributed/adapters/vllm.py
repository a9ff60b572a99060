"""``create_vllm_publisher``: the publisher for a ``VLLMChatClient`` (no vLLM import needed here)."""

from __future__ import annotations

from typing import Any

from ludic.distributed.interfaces import PolicyPublisher
from ludic.distributed.publisher import ClientPublisher, Rank0OnlyPublisher

TRANSPORTS = ("broadcast", "blob")


def create_vllm_publisher(
    client: Any,
    rank0_only: bool = True,
    *,
    transport: str = "broadcast",
    timeout_s: float = 120.0,
    probe: Any = None,
    lora: str = "merged",
    **broadcast_kwargs: Any,
) -> PolicyPublisher:
    """A publisher for a weight-update-enabled ``VLLMChatClient``; by default only rank 0 publishes.

    transport: "broadcast" (``BroadcastPolicyPublisher``: vLLM's weight-transfer routes, tensors
    over gloo/NCCL; works with ``vllm serve`` and Ludic's server) or "blob" (one safetensors upload
    to Ludic's ``/ludic/update_weights_blob``; Ludic's server only). ``broadcast_kwargs`` go to
    ``BroadcastPolicyPublisher`` (master_address, master_port, backend: "gloo", "nccl", or "shm" for Ludic's
    server on the same host; bucket_bytes, packed, pause_mode).
    probe: a ``SyncProbe`` checked after every publish (``ProbeCheckedPublisher``).
    lora: what a peft (LoRA) model publishes: "merged" weights (any server) or its "adapter" alone (Ludic's
    server, any transport; for ``vllm serve --enable-lora`` use ``VLLMLoraPublisher``).
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if not getattr(client, "enable_weight_updates", False):
        raise ValueError("create_vllm_publisher needs VLLMChatClient(..., enable_weight_updates=True)")
    if transport == "blob" and broadcast_kwargs:
        raise ValueError(f"options {sorted(broadcast_kwargs)} apply to transport='broadcast' only")

    def make() -> PolicyPublisher:
        from ludic.distributed.broadcast import BroadcastPolicyPublisher
        from ludic.distributed.sync_probe import ProbeCheckedPublisher

        if transport == "blob":
            inner: PolicyPublisher = ClientPublisher(client, timeout_s=timeout_s, lora=lora)
        else:
            inner = BroadcastPolicyPublisher(client, timeout_s=timeout_s, lora=lora, **broadcast_kwargs)
        return ProbeCheckedPublisher(inner, probe) if probe is not None else inner

    return Rank0OnlyPublisher(make, lora=lora) if rank0_only else make()
