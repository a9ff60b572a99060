"""The seam between the Trainer and evaluation: anything with ``evaluate(concurrency=) -> stats``.

The Trainer calls ``evaluator.evaluate(concurrency=cfg.eval_concurrency)`` every
``eval_every_n_steps``, with ``step=`` its step as well where ``evaluate`` takes that keyword (the library's
``Evaluator`` names its files by it), and logs the returned floats under ``eval/`` (keys already naming a group,
``perf/eval_seconds``, stay as they are). ``ludic.eval.Evaluator`` is the library's one; a coroutine
or a plain function both fit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Protocol, runtime_checkable

EvalStats = Mapping[str, float]


@runtime_checkable
class PolicyEvaluator(Protocol):
    """``evaluate(concurrency=)`` -> ``{name: float}``, or an awaitable of it."""

    def evaluate(self, *, concurrency: int) -> Awaitable[EvalStats] | EvalStats: ...
