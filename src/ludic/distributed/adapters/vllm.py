"""Publishing to a vLLM server through ``VLLMChatClient.sync_weights`` (no vLLM import needed here)."""

from __future__ import annotations

from typing import Any

from ludic.distributed.interfaces import PolicyPublisher
from ludic.distributed.publisher import ClientPublisher, Rank0OnlyPublisher


def create_vllm_publisher(
    client: Any, rank0_only: bool = True, *, timeout_s: float = 600.0
) -> PolicyPublisher:
    """A publisher for a weight-update-enabled vLLM client; by default only rank 0 publishes."""
    if rank0_only:
        return Rank0OnlyPublisher(lambda: ClientPublisher(client, timeout_s=timeout_s))
    return ClientPublisher(client, timeout_s=timeout_s)
