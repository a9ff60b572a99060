"""Who owns the weight update in progress: one publisher at a time, named by a token.

Without an owner, two publishers talking to one server interleave: the second's ``start`` clears the
first's staging, then either's calls land in the other's update and the server loads a model neither
sent. ``start`` therefore hands out an ``update_id``; while that update is in progress (its last call less
than ``timeout_s`` ago) another ``start`` or ``init`` is refused with 409, and a call naming another
``update_id`` is refused too. An owner that went quiet for ``timeout_s`` (a trainer that died midway) is
taken over by the next ``start``, and the buffers it reserved are retired, never handed out again.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass


class UpdateConflict(ValueError):
    """Another publisher's update is in progress, or the call names an update that is not (HTTP 409)."""


@dataclass
class UpdateOwner:
    timeout_s: float
    update_id: str | None = None  # the update in progress, None when there is none
    last_call: float = 0.0

    def busy(self) -> bool:
        return self.update_id is not None and time.monotonic() - self.last_call < self.timeout_s

    def refuse_if_busy(self, action: str) -> None:
        if self.busy():
            idle = time.monotonic() - self.last_call
            raise UpdateConflict(
                f"cannot {action}: weight update {self.update_id} of another publisher is in progress (last call "
                f"{idle:.1f}s ago; it is taken over once idle for {self.timeout_s:g}s, or ended by "
                "POST /ludic/abort_weight_update with its update_id)"
            )

    def open(self) -> str:
        """A new update's id (call ``refuse_if_busy`` first)."""
        self.update_id, self.last_call = f"u-{secrets.token_hex(8)}", time.monotonic()
        return self.update_id

    def check(self, given: object, *, required: bool) -> None:
        """A call of the update in progress: ``given`` must name it (``required``: it must be given)."""
        if given is None and not required:
            self.last_call = time.monotonic()
            return
        if self.update_id is None or given != self.update_id:
            raise UpdateConflict(
                f"update_id {given!r} is not the weight update in progress ({self.update_id!r}): POST "
                "/start_weight_update and send the update_id it returns with every call of that update"
            )
        self.last_call = time.monotonic()

    def close(self) -> None:
        self.update_id = None
