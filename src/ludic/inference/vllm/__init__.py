"""vLLM: the HTTP ChatClient for ``vllm serve`` (or Ludic's server) and the launcher of ``vllm serve``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.inference.vllm.client import VLLMChatClient

__all__ = [
    "VLLMChatClient",
]

__getattr__, __dir__ = lazy_exports(__name__)
