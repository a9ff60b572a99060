"""Getting trained weights from the trainer to the inference side."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.distributed.adapters.vllm import create_vllm_publisher
    from ludic.distributed.broadcast import BroadcastPolicyPublisher, PublishError
    from ludic.distributed.interfaces import PolicyPublisher
    from ludic.distributed.lora_payload import adapter_payload
    from ludic.distributed.lora_vllm import VLLMLoraPublisher
    from ludic.distributed.publisher import ClientPublisher, Rank0OnlyPublisher, current_rank
    from ludic.distributed.sync_probe import ProbeCheckedPublisher, SyncCheckError, SyncProbe

__all__ = [
    "BroadcastPolicyPublisher",
    "ClientPublisher",
    "PolicyPublisher",
    "ProbeCheckedPublisher",
    "PublishError",
    "Rank0OnlyPublisher",
    "SyncCheckError",
    "SyncProbe",
    "VLLMLoraPublisher",
    "adapter_payload",
    "create_vllm_publisher",
    "current_rank",
]

_EXPORTS = {
    "BroadcastPolicyPublisher": ("ludic.distributed.broadcast", "BroadcastPolicyPublisher"),
    "ClientPublisher": ("ludic.distributed.publisher", "ClientPublisher"),
    "PolicyPublisher": ("ludic.distributed.interfaces", "PolicyPublisher"),
    "ProbeCheckedPublisher": ("ludic.distributed.sync_probe", "ProbeCheckedPublisher"),
    "PublishError": ("ludic.distributed.broadcast", "PublishError"),
    "Rank0OnlyPublisher": ("ludic.distributed.publisher", "Rank0OnlyPublisher"),
    "SyncCheckError": ("ludic.distributed.sync_probe", "SyncCheckError"),
    "SyncProbe": ("ludic.distributed.sync_probe", "SyncProbe"),
    "VLLMLoraPublisher": ("ludic.distributed.lora_vllm", "VLLMLoraPublisher"),
    "adapter_payload": ("ludic.distributed.lora_payload", "adapter_payload"),
    "create_vllm_publisher": ("ludic.distributed.adapters.vllm", "create_vllm_publisher"),
    "current_rank": ("ludic.distributed.publisher", "current_rank"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
