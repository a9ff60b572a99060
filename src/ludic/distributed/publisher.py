"""Publishers: hand weights to a ChatClient, and a wrapper that publishes from rank 0 only."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from ludic.distributed.interfaces import PolicyPublisher
from ludic.distributed.lora_payload import check_lora_mode


class ClientPublisher:
    """Publish by calling ``client.sync_weights(state_dict, timeout_s=, version=)``.

    Works with the in-process ``TransformersChatClient`` and with ``VLLMChatClient`` alike: the
    client owns the transport, this class only adapts the trainer's call.
    """

    def __init__(self, client: Any, *, timeout_s: float = 600.0, lora: str = "merged") -> None:
        if not callable(getattr(client, "sync_weights", None)):
            raise TypeError(
                f"ClientPublisher needs a client with sync_weights(params, *, timeout_s, version); "
                f"{type(client).__name__} has none"
            )
        self.client = client
        self.timeout_s = timeout_s
        self.lora_publish = check_lora_mode(lora)  # "adapter": a peft model's adapter alone (the client serves it)
        self.last_status: str | None = None
        self.last_stats: dict[str, float] = {}

    def publish(self, state_dict: Mapping[str, Tensor], version: int | None = None) -> None:
        payload = state_dict if getattr(state_dict, "config", None) is not None else dict(state_dict)
        self.last_status = self.client.sync_weights(
            payload, timeout_s=self.timeout_s, version=version
        )
        nbytes = sum(t.numel() * t.element_size() for t in payload.values())
        self.last_stats = {"publish_tensors": float(len(payload)), "publish_bytes": float(nbytes)}

    def declare_restore(self, version: int) -> bool:
        """Let the next publish go back to ``version`` (``client.declare_restore``): a resumed trainer restores
        its checkpoint's weights under their own version. False when the client or server has no such call."""
        declare = getattr(self.client, "declare_restore", None)
        if not callable(declare):
            return False
        if "timeout_s" in inspect.signature(declare).parameters:
            return bool(declare(version, timeout_s=self.timeout_s))
        return bool(declare(version))


def current_rank() -> int:
    """This process's rank: torch.distributed's when initialised, else ``$RANK``, else 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


class Rank0OnlyPublisher:
    """In multi-process training only rank 0 talks to the inference server; other ranks no-op.

    The rank is read at the first ``publish`` (so this may be built before the process group
    exists), and ``make_inner`` (a zero-argument factory) is called then, on rank 0 only: other
    ranks never open connections (or NCCL groups) to the server.
    """

    def __init__(self, make_inner: Callable[[], PolicyPublisher], *, lora: str = "merged") -> None:
        if not callable(make_inner):
            raise TypeError(f"Rank0OnlyPublisher takes a zero-argument factory, got {make_inner!r}")
        self.lora_publish = check_lora_mode(lora)  # the inner publisher is built later: say it here
        self._make_inner = make_inner
        self.rank: int | None = None
        self.inner: PolicyPublisher | None = None

    def publish(self, state_dict: Mapping[str, Tensor], version: int | None = None) -> None:
        if self.rank is None:
            self.rank = current_rank()
            self.inner = self._make_inner() if self.rank == 0 else None
        if self.inner is not None:
            self.inner.publish(state_dict, version=version)

    def declare_restore(self, version: int) -> bool:
        """The inner publisher's ``declare_restore`` (rank 0; other ranks: False)."""
        if self.rank is None:
            self.rank = current_rank()
            self.inner = self._make_inner() if self.rank == 0 else None
        return declare_restore(self.inner, version)

    @property
    def last_stats(self) -> dict[str, float]:
        return dict(getattr(self.inner, "last_stats", {}) or {})


def declare_restore(publisher: object, version: int) -> bool:
    """``publisher.declare_restore(version)`` where it has one (the next publish may then go back to ``version``:
    a trainer resumed from a checkpoint older than what it had published); False where it has none."""
    declare = getattr(publisher, "declare_restore", None)
    return bool(declare(version)) if callable(declare) else False
