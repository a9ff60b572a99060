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

_EXPORTS = {
    "ChatClient": ("ludic.inference.client", "ChatClient"),
    "ChatCompletionRequest": ("ludic.inference.request", "ChatCompletionRequest"),
    "DEFAULT_MAX_TOKENS": ("ludic.inference.sampling", "DEFAULT_MAX_TOKENS"),
    "InferenceSpec": ("ludic.inference.sampling", "InferenceSpec"),
    "SamplingConfig": ("ludic.inference.sampling", "SamplingConfig"),
    "TransformersChatClient": ("ludic.inference.embedded.transformers_client", "TransformersChatClient"),
    "VLLMChatClient": ("ludic.inference.vllm.client", "VLLMChatClient"),
    "VersionedClient": ("ludic.inference.client", "VersionedClient"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
