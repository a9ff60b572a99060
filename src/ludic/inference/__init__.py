"""Inference clients. Imports without vLLM installed."""

from ludic.inference.client import ChatClient, VersionedClient
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.inference.transformers_client import TransformersChatClient
from ludic.inference.vllm_client import VLLMChatClient

__all__ = [
    "ChatClient",
    "ChatCompletionRequest",
    "InferenceSpec",
    "SamplingConfig",
    "TransformersChatClient",
    "VLLMChatClient",
    "VersionedClient",
]
