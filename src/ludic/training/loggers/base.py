"""The training-logger seam and the simple sinks: print, fan-out (tee) and JSON lines."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO, runtime_checkable

from ludic.training.loggers.prefix import prefix_stats, to_float

_log = logging.getLogger(__name__)


@runtime_checkable
class TrainingLogger(Protocol):
    """Anything the Trainer can hand a step's stats to (``Trainer(train_logger=...)``).

    The Trainer calls ``log(step, stats)`` after optimizer step ``step`` (1-based; the step count
    after the update) whenever ``step % TrainerConfig.log_every == 0``, with the same flat dict
    ``train_step`` returns (``train/...``, ``perf/...`` and, on evaluation steps, ``eval/...``
    floats). A step the preprocess emptied (every group filtered) is logged too, with
    ``train/empty_after_filter = 1.0`` and no optimizer step. The Trainer never calls ``close``;
    the sinks here are context managers for that. ``Trainer.train`` also returns the stats of
    every step it ran, so a logger is only needed for live output or files.
    """

    def log(self, step: int, stats: Mapping[str, Any]) -> None: ...


class PrintLogger:
    """One line per step: ``[prefix] step 3 | train/loss=0.1234 | ...`` (keys auto-prefixed, sorted)."""

    def __init__(self, prefix: str = "", *, precision: int = 4, stream: TextIO | None = None) -> None:
        self.prefix = prefix
        self.precision = precision
        self.stream = stream

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        parts = [f"{self.prefix} step {step}".strip()]
        for key, value in sorted(prefix_stats(stats).items()):
            value = to_float(value)
            text = f"{value:.{self.precision}f}" if isinstance(value, float) else str(value)
            parts.append(f"{key}={text}")
        print(" | ".join(parts), file=self.stream or sys.stdout, flush=True)

    def close(self) -> None:
        """Nothing to release."""


class TeeLogger:
    """Fan one ``log`` call out to several sinks; a failing sink is reported, the others still log."""

    def __init__(self, *loggers: TrainingLogger) -> None:
        self.loggers = list(loggers)
        self.failures: list[tuple[int, TrainingLogger, BaseException]] = []

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        for sink in self.loggers:
            try:
                sink.log(step, stats)
            except Exception as exc:  # a broken dashboard must not stop training
                self.failures.append((step, sink, exc))
                _log.warning("TeeLogger: %s.log failed at step %d: %r", type(sink).__name__, step, exc)

    def show_eval(self, step: int, stats: Mapping[str, Any]) -> None:
        """Tell the sinks that show a run's latest held-out evaluation about one outside the steps."""
        for sink in self.loggers:
            show = getattr(sink, "show_eval", None)
            if callable(show):
                show(step, stats)

    def log_completions(self, step: int, samples: Sequence[Any]) -> None:
        """Hand a table of sampled completions to the sinks that show one (``CompletionsLogger`` calls this)."""
        for sink in self.loggers:
            show = getattr(sink, "log_completions", None)
            if not callable(show):
                continue
            try:
                show(step, samples)
            except Exception as exc:  # like log: a broken sink must not stop training
                self.failures.append((step, sink, exc))
                _log.warning("TeeLogger: %s.log_completions failed at step %d: %r", type(sink).__name__, step, exc)

    def __enter__(self) -> TeeLogger:
        for sink in self.loggers:
            if hasattr(sink, "__enter__"):
                sink.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every sink that can be closed (exits context-managed sinks such as RichLiveLogger)."""
        for sink in self.loggers:
            closer = getattr(sink, "__exit__", None)
            try:
                if closer is not None:
                    closer(None, None, None)
                elif hasattr(sink, "close"):
                    sink.close()
            except Exception as exc:
                _log.warning("TeeLogger: closing %s failed: %r", type(sink).__name__, exc)


class JsonlLogger:
    """Append one JSON object per step, ``{"step": n, **stats}``, to ``path`` (read by plots and tools).

    One-element tensors and numpy values are written as numbers, keys as strings; NaN and the infinities as
    Python's ``json`` writes them (``NaN``, ``Infinity``: what Python and pandas read back as floats, and what
    the files of earlier runs hold, so every reader sees one format). A stat named ``step`` is kept as ``train/step``: the line's ``step`` is
    the step logged. Appending to a file whose last line a killed run cut short starts on a new line (the cut
    line stays as it was, the new records whole), and a file deleted while the run logs is created again.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: TextIO | None = self._open()

    def _open(self) -> TextIO:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = self.path.open("a", encoding="utf-8")
        if _ends_mid_line(self.path):
            fh.write("\n")
        return fh

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        if self._fh is None:
            raise RuntimeError(f"JsonlLogger({self.path}) is closed")
        if os.fstat(self._fh.fileno()).st_nlink == 0:  # deleted under us: lines would go to no file at all
            _log.warning("JsonlLogger: %s was deleted while the run logged; writing a new one from step %d",
                         self.path, step)  # fmt: skip
            fresh = self._open()  # a folder that cannot be made again: OSError naming it, retried next step
            self._fh.close()
            self._fh = fresh
        self._fh.write(json.dumps(_record(step, stats), default=str) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> JsonlLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _record(step: int, stats: Mapping[str, Any]) -> dict[str, Any]:
    """``{"step": step, **stats}``, JSON-ready; a stat named ``step`` goes under ``train/step``."""
    record: dict[str, Any] = {"step": step}
    for key, value in stats.items():
        name = key if isinstance(key, str) else str(key)
        record["train/step" if name == "step" else name] = _jsonable(value)
    return record


def _jsonable(value: Any) -> Any:
    """``value`` for ``json.dumps``: one-element tensors and numpy values as numbers (larger ones as their
    ``str``, as before), in nested dicts and lists too."""
    value = to_float(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _ends_mid_line(path: Path) -> bool:
    """Whether ``path`` is non-empty and its last byte is not a newline (a write cut short by a kill)."""
    with path.open("rb") as fh:
        if fh.seek(0, os.SEEK_END) == 0:
            return False
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) != b"\n"
