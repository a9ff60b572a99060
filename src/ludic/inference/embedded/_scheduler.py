"""How the embedded engine decodes its queue so that a long request does not hold up short ones.

Before, a batch ran to its longest row and requests arriving meanwhile waited for all of it (a
1-token request waited 1.4 s behind a 2,040-token one). Now a batch opens a *region*: one hold of the
weights lock in which several runs ("cohorts", each a ``BatchGenerator.steps``) decode in turn, one
step each per round. A request arriving meanwhile joins the region as a new cohort at the next round
(prefilled on its own, then stepping beside the others) and is answered as soon as its cohort ends,
if it fits the region:

- its ``max_tokens`` is fewer than the steps the region's longest cohort still has, so a region ends no
  later (in steps) than its first batch would have, and a weight update waits no longer than before;
- the region has fewer than ``MAX_COHORTS`` cohorts and ``max_batch_size`` rows.

Otherwise it waits for the next region, as before. Cohorts keep separate KV caches (no cache surgery;
each costs its own forward per round, which is why their number is bounded). A cohort that fails is
rerun row by row; a row that fails alone fails only its own request.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ludic.inference.embedded._generation import BatchGenerator, RowResult, Steps
from ludic.inference.weight_sync.pause import PauseGate
from ludic.kernels.cpu.threads import shared as shared_threads

MAX_COHORTS = 4
"""Runs one region decodes in turn (each costs a forward per round)."""


@dataclass
class Cohort:
    """One run in a region: its requests, its step generator, and its weight-version spans."""

    pendings: list[Any]  # the engine's _Pending records
    run: Steps
    spans: list[tuple[int, int]]  # [(first token index, policy version), ...]
    longest: int  # its largest max_tokens
    generated: int = 0
    reload: bool = False  # the weights changed since its last step: prefill its live rows again


@dataclass
class Region:
    """What the loop thread needs to decide, without locks, whether a new request may join."""

    first: list[Any]
    max_rows: int
    joiners: deque = field(default_factory=deque)  # appended on the loop thread, drained by the decoder
    horizon: int = 0  # steps the longest live cohort may still take
    cohorts: int = 1
    joined: int = 0  # rows admitted (loop thread)
    finished: int = 0  # rows answered (decoding thread)

    def __post_init__(self) -> None:
        self.horizon = max(p.row.sampling.max_tokens for p in self.first)
        self.joined = len(self.first)

    def admits(self, row: Any) -> bool:
        return (
            row.sampling.max_tokens < self.horizon  # it starts a round later than the others' next step
            and self.cohorts < MAX_COHORTS  # waiting joiners form one cohort, counted once it starts
            and self.joined - self.finished < self.max_rows
        )

    def join(self, pending: Any) -> None:
        self.joined += 1
        self.joiners.append(pending)


Deliver = Callable[..., None]


class EngineSchedulerMixin:
    """``_run_batch`` (a region) for ``TransformersChatClient``."""

    _generator: BatchGenerator
    _weights_lock: threading.Lock
    gate: PauseGate
    policy_version: int
    weights_epoch: int  # counts weight loads (``EngineWeightsMixin``)
    generate_in_thread: bool
    max_batch_size: int
    _running: list[Any]
    _pending: list[Any]
    _region: Region | None

    def _try_join(self, pending: Any) -> bool:
        """On the loop thread: hand ``pending`` to the region decoding now, if it fits there."""
        region = self._region
        if region is None or self.gate.paused or not region.admits(pending.row):
            return False
        self._running.append(pending)  # so a pause's abort reaches it
        region.join(pending)
        return True

    async def _run_batch(self, batch: list[Any]) -> None:
        """Decode ``batch`` and whatever joins it; answer each cohort as it ends."""
        loop = asyncio.get_running_loop()
        region = Region(batch, self.max_batch_size)
        self._region, self._running = region, list(batch)
        try:
            if self.generate_in_thread:
                deliver: Deliver = lambda fn, *a: loop.call_soon_threadsafe(fn, *a)  # noqa: E731
                await asyncio.to_thread(self._decode_region, region, deliver)
            else:  # the loop is busy meanwhile, so nothing joins
                self._decode_region(region, lambda fn, *a: fn(*a))
        except Exception as exc:  # outside any cohort (binding the weights): no caller is left waiting
            for p in [*self._running, *region.joiners]:
                _fail(p, exc)
        finally:
            self._region, self._running = None, []
            self._pending[:0] = [p for p in region.joiners if not p.future.done()]  # joined too late: next region

    def _decode_region(self, region: Region, deliver: Deliver) -> None:
        """On the decoding thread: round-robin the region's cohorts one step each until all have ended."""
        cpu = shared_threads() if self._generator.device.type == "cpu" else None  # threads follow the free cores
        with self._weights_lock, cpu.computing() if cpu else contextlib.nullcontext():  # weights swap between regions
            weights = [self._generator.bind(len(region.first))]
            live = [self._cohort(region.first, weights)]
            while live:
                if cpu is not None:
                    cpu.fit()
                if region.joiners:
                    joiners = [region.joiners.popleft() for _ in range(len(region.joiners))]
                    live.append(self._cohort(joiners, weights))
                live = [c for cohort in live for c in self._advance(cohort, weights, region, deliver)]
                region.cohorts = len(live)
                region.horizon = max((c.longest - c.generated for c in live), default=0)
                if live:
                    self._between_rounds(live, weights, len(region.first))

    def _cohort(self, pendings: list[Any], weights: list) -> Cohort:
        rows = [p.row for p in pendings]
        run = self._generator.steps(rows, weights=weights)
        return Cohort(pendings, run, [(0, self.policy_version)], max(r.sampling.max_tokens for r in rows))

    def _advance(self, cohort: Cohort, weights: list, region: Region, deliver: Deliver) -> list[Cohort]:
        """One step of ``cohort``: the cohorts still live afterwards (itself, none, or its rows alone)."""
        try:
            cohort.generated = cohort.run.send(True if cohort.reload else None)
            cohort.reload = False
            return [cohort]
        except StopIteration as done:
            region.finished += len(cohort.pendings)
            deliver(_answer, cohort.pendings, done.value, cohort.spans)
            return []
        except Exception as exc:
            if len(cohort.pendings) > 1:  # a bad row fails only itself: rerun each alone
                return [self._cohort([p], weights) for p in cohort.pendings]
            region.finished += 1
            deliver(_fail, cohort.pendings[0], exc)
            return []

    def _between_rounds(self, live: list[Cohort], weights: list, rows: int) -> None:
        """Where a ``keep`` pause freezes the region (weights lock released); new weights count from here."""
        epoch = self.weights_epoch
        if self.gate.hold(self._weights_lock):
            version = self.policy_version
            for cohort in live:
                if cohort.generated == 0:  # not stepped yet (a row rerun alone): all its tokens are the new weights'
                    cohort.spans = [(0, version)]
                    continue
                if cohort.spans[-1][1] != version:
                    cohort.spans.append((cohort.generated, version))
                cohort.reload = cohort.reload or self.weights_epoch != epoch  # old K/V: prefill again
            weights[0] = self._generator.bind(rows)  # the lean path's copies of the new weights


def _answer(pendings: list[Any], results: list[RowResult], spans: list[tuple[int, int]]) -> None:
    for p, res in zip(pendings, results, strict=True):
        if not p.future.done():
            p.future.set_result((res, spans))


def _fail(pending: Any, exc: BaseException) -> None:
    if not pending.future.done():
        pending.future.set_exception(exc)
