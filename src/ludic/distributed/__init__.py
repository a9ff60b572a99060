"""Getting trained weights from the trainer to the inference side."""

from ludic.distributed.adapters.vllm import create_vllm_publisher
from ludic.distributed.broadcast import BroadcastPolicyPublisher, PublishError
from ludic.distributed.interfaces import PolicyPublisher
from ludic.distributed.publisher import ClientPublisher, Rank0OnlyPublisher, current_rank

__all__ = [
    "BroadcastPolicyPublisher",
    "ClientPublisher",
    "PolicyPublisher",
    "PublishError",
    "Rank0OnlyPublisher",
    "create_vllm_publisher",
    "current_rank",
]
