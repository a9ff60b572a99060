"""The seam between the trainer and whatever serves the policy (in-process client, vLLM server)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class PolicyPublisher(Protocol):
    """Pushes a new set of policy weights to the inference side, tagged with a policy version."""

    def publish(self, state_dict: Mapping[str, Tensor], version: int | None = None) -> None: ...
