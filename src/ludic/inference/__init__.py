"""Inference clients. Imports without vLLM installed."""

from ludic.inference.client import ChatClient, VersionedClient
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import DEFAULT_MAX_TOKENS, InferenceSpec, SamplingConfig
from ludic.inference.transformers_client import TransformersChatClient
from ludic.inference.vllm_client import VLLMChatClient

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ChatClient",
    "ChatCompletionRequest",
    "InferenceSpec",
    "SamplingConfig",
    "TransformersChatClient",
    "VLLMChatClient",
    "VersionedClient",
]
