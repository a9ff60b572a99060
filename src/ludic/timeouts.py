"""How long each wait on the training path may last, and the one error every bound raises.

Why one place: the waits that hang a run silently (a collective whose peer is gone, an HTTP call to a
server that accepted and stalled, a Redis that stopped answering, a trainer starved of data, an actor
never admitted) each get a bound here, set from the run config's ``[timeouts]`` table
(``ludic.config.timeouts_section``), and each fails with :class:`WaitTimeout`, which names the peer, the
operation and the time waited. This module sits beside ``types.py`` so every layer may import it; it
imports nothing of Ludic's and no third-party library.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


class WaitTimeout(TimeoutError):
    """A bounded wait ran out: ``peer`` (who did not answer), ``operation`` (what was waited for),
    ``waited_s`` (how long), ``bound_s`` (the configured bound) and ``detail`` (what was seen meanwhile)."""

    def __init__(
        self, *, peer: str, operation: str, waited_s: float, bound_s: float | None = None, detail: str = ""
    ) -> None:
        self.peer, self.operation, self.waited_s = peer, operation, waited_s
        self.bound_s, self.detail = bound_s, detail
        bound = f" (bound {bound_s:g} s)" if bound_s is not None else ""
        message = f"{operation}: no answer from {peer} after {waited_s:.1f} s{bound}"
        super().__init__(message + (f"; {detail}" if detail else ""))

    def __reduce__(self):  # picklable with its keywords (multiprocessing, subprocess reports)
        return _rebuild, (type(self), self.peer, self.operation, self.waited_s, self.bound_s, self.detail)


def _rebuild(
    cls: type[WaitTimeout], peer: str, operation: str, waited_s: float, bound_s: float | None, detail: str
) -> WaitTimeout:
    return cls(peer=peer, operation=operation, waited_s=waited_s, bound_s=bound_s, detail=detail)


ON_STALL = ("log", "exit")


@dataclass(frozen=True)
class Timeouts:
    """The bounds, in seconds (all > 0). Defaults are documented once, in docs/cluster.md's ``## Timeouts``."""

    collective_s: float = 1800.0
    """torch.distributed's process-group init and every collective and barrier (``init_process_group(timeout=)``)."""
    http_s: float = 600.0
    """One inference HTTP call, its retries included (a generation request waits this long at most)."""
    publish_s: float = 600.0
    """One weight publish to one server."""
    redis_s: float = 30.0
    """One Redis call's reply (beyond XREAD's own BLOCK)."""
    redis_reconnect_s: float = 60.0
    """How long a Redis call keeps retrying on new connections (a restart, a blip) before it fails."""
    queue_wait_s: float = 900.0
    """The trainer waiting with no new stream entry for its next batch; an actor waiting for admission or room."""
    step_watchdog_s: float = 3600.0
    """A training step that has not advanced for this long is reported (``ludic.training.watchdog``)."""
    on_stall: str = "log"
    """What the watchdog does then: ``"log"`` (every thread's stack, at ERROR) or ``"exit"`` (that, then exit 70)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
            if f.name != "on_stall" and not ok:
                raise ValueError(f"Timeouts.{f.name} must be a number of seconds > 0, got {value!r}")
        if self.on_stall not in ON_STALL:
            raise ValueError(f"Timeouts.on_stall must be one of {ON_STALL}, got {self.on_stall!r}")
