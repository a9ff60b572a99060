"""Inference clients. Imports without vLLM installed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.inference.client import ChatClient, VersionedClient
    from ludic.inference.embedded.transformers_client import TransformersChatClient
    from ludic.inference.request import ChatCompletionRequest
    from ludic.inference.sampling import DEFAULT_MAX_TOKENS, InferenceSpec, SamplingConfig
    from ludic.inference.vllm.client import VLLMChatClient

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

__getattr__, __dir__ = lazy_exports(__name__)
