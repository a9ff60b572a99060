"""A thread that reports a training step that has stopped advancing, with every thread's stack.

Why: the waits that hang a run (a collective whose peer died, a publish to a stalled server) block the step
without a word, and a job then sits until its time limit. The watchdog reads the step counter from its own
thread; once it has not changed for ``bound_s`` (``[timeouts].step_watchdog_s``) it logs at ERROR the step,
the time since it last advanced and the stack of every thread of the process (the blocked frame's function
names the wait), tagged with the rank under torchrun. ``on_stall="exit"`` then ends the process with
:data:`STALL_EXIT_CODE`, so torchrun tears the whole job down instead of leaving it hanging.

It lives beside the Trainer, not in it: :func:`watch_steps` wraps a loop (``ludic train`` wraps
``trainer.train``), and the Trainer's step stays algorithm- and deployment-blind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator

from ludic.timeouts import ON_STALL

log = logging.getLogger(__name__)
STALL_EXIT_CODE = 70
"""The exit status of a process the watchdog ended (``EX_SOFTWARE``)."""


def rank_tag() -> str:
    """``"rank R"`` under torchrun (its ``RANK``), else ``"process PID"``."""
    rank = os.environ.get("RANK")
    return f"rank {rank}" if rank is not None else f"process {os.getpid()}"


def thread_stacks(skip: int | None = None) -> str:
    """Every live thread's stack, innermost call last (as a traceback), except thread id ``skip``."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        stack = "".join(traceback.format_stack(frame))
        parts.append(f'Thread "{names.get(ident, "?")}" ({ident}):\n{stack}')
    return "\n".join(parts)


class StepWatchdog:
    """Watches ``step()`` (e.g. ``lambda: trainer.step``) from a daemon thread; see the module docstring.

    A stall is reported once per ``bound_s`` while it lasts; ``poll_s`` (default: ``bound_s / 10``, at most
    5 s) is how often the counter is read, so a report comes at most ``poll_s`` after the bound."""

    def __init__(
        self, step: Callable[[], int], *, bound_s: float, on_stall: str = "log", poll_s: float | None = None,
        exit: Callable[[int], object] = os._exit,
    ) -> None:  # fmt: skip
        if not bound_s > 0:
            raise ValueError(f"bound_s must be > 0 seconds, got {bound_s!r}")
        if on_stall not in ON_STALL:
            raise ValueError(f"on_stall must be one of {ON_STALL}, got {on_stall!r}")
        self.step, self.bound_s, self.on_stall, self._exit = step, bound_s, on_stall, exit
        self.poll_s = poll_s if poll_s is not None else min(bound_s / 10, 5.0)
        self.reports: list[str] = []  # every report made, in order
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> StepWatchdog:
        if self._thread is not None:
            raise RuntimeError("this StepWatchdog was already started")
        self._thread = threading.Thread(target=self._run, name="ludic-step-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(self.poll_s * 2, 1.0))

    def _run(self) -> None:
        seen, since, reported_at = self.step(), time.monotonic(), 0.0
        while not self._stop.wait(self.poll_s):
            now, current = time.monotonic(), self.step()
            if current != seen:
                seen, since, reported_at = current, now, 0.0
                continue
            stalled = now - since
            if stalled >= self.bound_s and now - reported_at >= self.bound_s:
                reported_at = now
                self._report(current, stalled)

    def _report(self, step: int, stalled_s: float) -> None:
        action = f"exiting with code {STALL_EXIT_CODE}" if self.on_stall == "exit" else "still waiting"
        report = (
            f"[{rank_tag()}] step watchdog: training step {step + 1} (after step {step}) has not advanced for "
            f"{stalled_s:.1f} s (bound {self.bound_s:g} s, [timeouts].step_watchdog_s); {action}. "
            f"Stacks of every thread:\n{thread_stacks(skip=threading.get_ident())}"
        )
        self.reports.append(report)
        log.error("%s", report)
        if self.on_stall == "exit":
            for handler in logging.getLogger().handlers:  # os._exit skips logging's own flush at exit
                handler.flush()
            sys.stderr.flush()
            self._exit(STALL_EXIT_CODE)


@contextlib.contextmanager
def watch_steps(
    step: Callable[[], int], *, bound_s: float, on_stall: str = "log", poll_s: float | None = None
) -> Iterator[StepWatchdog]:
    """A :class:`StepWatchdog` running for the ``with`` block (``with watch_steps(lambda: trainer.step, ...)``)."""
    dog = StepWatchdog(step, bound_s=bound_s, on_stall=on_stall, poll_s=poll_s).start()
    try:
        yield dog
    finally:
        dog.stop()
