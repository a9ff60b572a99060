"""Getting trained weights from the trainer to the inference side."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.distributed.adapters.vllm import create_vllm_publisher
    from ludic.distributed.broadcast import BroadcastPolicyPublisher, PublishError
    from ludic.distributed.fanout import FanoutPublisher, FanoutPublishError
    from ludic.distributed.interfaces import PolicyPublisher
    from ludic.distributed.lora_payload import adapter_payload
    from ludic.distributed.lora_vllm import VLLMLoraPublisher
    from ludic.distributed.publisher import ClientPublisher, Rank0OnlyPublisher, current_rank
    from ludic.distributed.sync_probe import ProbeCheckedPublisher, SyncCheckError, SyncProbe

__all__ = [
    "BroadcastPolicyPublisher",
    "ClientPublisher",
    "FanoutPublishError",
    "FanoutPublisher",
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

__getattr__, __dir__ = lazy_exports(__name__)
