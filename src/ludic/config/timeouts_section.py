"""``[timeouts]``: the bound of every wait on the training path, in one table (``ludic.timeouts.Timeouts``).

Each field is the run-config face of the same-named field of :class:`ludic.timeouts.Timeouts`; a bound
that runs out raises ``ludic.timeouts.WaitTimeout`` naming the peer, the operation and the time waited.
The defaults and which call each bound covers are in docs/cluster.md (``## Timeouts``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from ludic.config.section_base import Section
from ludic.timeouts import Timeouts


class TimeoutsSection(Section):
    """``[timeouts]``: seconds each wait may last (all > 0); see docs/cluster.md."""

    collective_s: float = 1800.0
    """torch.distributed's process-group init and every collective and barrier of the trainer's ranks. Keep it
    above the longest time rank 0 works alone while the others wait: its wait for data (``queue_wait_s``), a
    publish (``publish_s``), an evaluation, a checkpoint."""
    http_s: float = 600.0
    """One inference HTTP call (a generation, a version query), its retries included."""
    publish_s: float = 600.0
    """One weight publish to one inference server."""
    redis_s: float = 30.0
    """One Redis call's reply (beyond XREAD's own BLOCK)."""
    redis_reconnect_s: float = 60.0
    """How long a Redis call retries on new connections (Redis restarting, a network blip) before failing."""
    queue_wait_s: float = 900.0
    """The trainer waiting with no new stream entry for its next batch; an actor waiting for admission or room."""
    step_watchdog_s: float = 3600.0
    """A training step that has not advanced for this long is reported with every thread's stack."""
    on_stall: Literal["log", "exit"] = "log"
    """The watchdog's action on a stalled step: log the report (``log``), or log it and exit the process with
    code 70 (``exit``) so torchrun tears the job down instead of waiting for the job's time limit."""

    @model_validator(mode="after")
    def _check(self) -> TimeoutsSection:
        self.to_timeouts()  # Timeouts' own checks, with its messages
        return self

    def to_timeouts(self) -> Timeouts:
        return Timeouts(**self.model_dump())
