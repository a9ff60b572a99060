"""The seam between agents and inference backends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from ludic.inference.request import ChatCompletionRequest
from ludic.types import ChatResponse


@runtime_checkable
class ChatClient(Protocol):
    """Any inference backend: in-process transformers, a vLLM server, a test double."""

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        """Sample one completion; returns the response and backend info (timings, version)."""
        ...

    def sync_weights(
        self,
        params: Mapping[str, torch.Tensor],
        *,
        timeout_s: float = 600.0,
        version: int | None = None,
    ) -> str:
        """Load new policy weights (all or nothing); returns a short status string."""
        ...


@runtime_checkable
class VersionedClient(ChatClient, Protocol):
    """A ChatClient that tags outputs with the policy version that produced them."""

    async def get_policy_version(self) -> int: ...
