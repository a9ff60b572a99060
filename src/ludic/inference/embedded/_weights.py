"""Weight updates for the embedded engine (``TransformersChatClient``): all or nothing, between batches.

Every name, shape and dtype is checked before anything is copied; the swap takes the engine's weights
lock, which a decoding batch holds from its first step to its last (or releases while a ``keep`` pause
freezes it), so every token comes from exactly one policy version.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch

from ludic.inference.embedded.adapters import AdapterState
from ludic.inference.weight_sync.adapter_config import AdapterPayload
from ludic.inference.weight_sync.weights import (
    assign_weights,
    next_version,
    parse_version,
    validate_state_dict,
)


class EngineWeightsMixin:
    """``sync_weights`` / ``load_validated`` over the engine's ``model``, ``_weights_lock`` and ``policy_version``."""

    model: torch.nn.Module
    policy_version: int
    _weights_lock: threading.Lock
    weights_epoch: int = 0  # counts loads: a frozen batch whose epoch moved prefills its rows again
    _adapter: AdapterState | None = None
    adapter_serving: str = "fold"  # "fold" | "unmerged" (``ludic.inference.embedded.adapters.ADAPTER_SERVING``)
    restore_to: int | None = None  # a declared restore (``declare_restore``): the next update may go back to it

    @property
    def adapter(self) -> AdapterState:
        """The LoRA adapter served, if any (``ludic.inference.embedded.adapters``), as ``adapter_serving`` says."""
        if self._adapter is None:
            self._adapter = AdapterState(self.adapter_serving)
        return self._adapter

    def sync_weights(
        self,
        params: Mapping[str, torch.Tensor],
        *,
        timeout_s: float = 600.0,
        version: int | None = None,
    ) -> str:
        """Load (a subset of) a state dict all-or-nothing, then bump the policy version.

        Every name, shape and dtype is checked before anything is copied. The copy waits for the
        batch being generated to finish (weights swap between batches, never mid-forward), so
        call it off the event loop (e.g. ``asyncio.to_thread``) when requests are in flight.
        Floating-point tensors are cast to the model's dtype (a bf16 trainer can publish to fp32).
        An ``AdapterPayload`` (LoRA tensors + config) is served as an adapter (``sync_adapter``).
        """
        if isinstance(params, AdapterPayload):
            return self.sync_adapter(params, timeout_s=timeout_s, version=version)
        validate_state_dict(params, self.model.state_dict())
        return self.load_validated(params, timeout_s=timeout_s, version=version)

    def load_validated(
        self, params: Mapping[str, torch.Tensor], *, timeout_s: float = 600.0, version: int | None = None,
        adopt: bool = False,
    ) -> str:
        """``sync_weights`` after ``validate_state_dict`` passed. ``adopt``: the caller hands ``params`` over
        (the server's receive buffers), so a parameter whose dtype and device already match takes the
        tensor as its storage instead of a copy of it; the caller must not write to it afterwards."""
        if not self._weights_lock.acquire(timeout=timeout_s):
            raise TimeoutError(f"sync_weights could not acquire the engine within {timeout_s}s")
        try:
            new_version = self.next_version_for(version)  # refused before anything is copied
            with torch.no_grad():
                self.adapter.restore_base(self.model)  # a full update replaces the base; the adapter goes
                assign_weights(self.model, params, adopt=adopt)
            self.policy_version, self.restore_to = new_version, None
            self.weights_epoch += 1
        finally:
            self._weights_lock.release()
        return f"loaded {len(params)} tensors, policy_version={self.policy_version}"

    def sync_adapter(
        self, payload: AdapterPayload, *, timeout_s: float = 600.0, version: int | None = None, checked: bool = False
    ) -> str:
        """Serve a LoRA adapter (``W_base + scaling * B @ A`` on its layers, folded or unmerged as
        ``adapter_serving`` says), all or nothing, as a new version.
        Refused (``AdapterRefused``, a ValueError) when its names, shapes, values or base do not fit; the old
        weights then keep serving at the old version. ``checked``: the caller (the weight receiver) checked
        shapes and values against ``adapter.expected_metas`` already; only the base is checked again."""
        if not self._weights_lock.acquire(timeout=timeout_s):
            raise TimeoutError(f"sync_adapter could not acquire the engine within {timeout_s}s")
        try:
            new_version = self.next_version_for(version)
            self.adapter.validate(self.model, payload, payload.config, checked=checked)
            self.adapter.apply(self.model, payload, payload.config)
            self.policy_version, self.restore_to = new_version, None
            self.weights_epoch += 1
        finally:
            self._weights_lock.release()
        return f"applied adapter {payload.config.name!r} ({len(payload)} tensors), policy_version={self.policy_version}"

    def unload_adapter(self, timeout_s: float = 600.0, *, name: str | None = None) -> bool:
        """Serve the base again (vLLM's unload route); the version stays as it is. ``name``: only if the adapter
        served has that name (checked under the lock); returns whether one was unloaded."""
        if not self._weights_lock.acquire(timeout=timeout_s):
            raise TimeoutError(f"unload_adapter could not acquire the engine within {timeout_s}s")
        try:
            current = self.adapter.config
            if current is None or (name is not None and current.name != name):
                return False
            self.adapter.restore_base(self.model)
            self.weights_epoch += 1
        finally:
            self._weights_lock.release()
        return True

    def next_version_for(self, requested: Any) -> int:
        """The version an update labelled ``requested`` gets (``next_version``): never below the served one,
        except down to a declared restore's version."""
        floor = self.policy_version
        if requested is not None and self.restore_to is not None:
            floor = min(floor, self.restore_to)
        return next_version(requested, floor)

    def declare_restore(self, version: Any) -> int:
        """Let the next weight update carry ``version`` though the served version is above it: a trainer that
        lost the steps after its last checkpoint (a host died) restores that checkpoint's weights, and the
        steps it trains again reuse those versions. The served version changes only when that update loads
        (until then the old weights keep serving under their own version); ordinary updates never go back.
        Returns the version declared."""
        self.restore_to = parse_version(version)  # one assignment: an update's check reads the old or the new
        return self.restore_to

    def restart_versions(self, version: int = 0) -> None:
        """Set the policy version without loading weights: the in-process owner starting a new count (the
        quickstart's RL after its SFT warm start). Updates are refused below the served version, so this
        is the one way back, and it is not reachable over HTTP."""
        if not self._weights_lock.acquire(timeout=600.0):
            raise TimeoutError("restart_versions could not acquire the engine within 600s")
        try:
            self.policy_version = parse_version(version)
        finally:
            self._weights_lock.release()
