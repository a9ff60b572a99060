"""Resume a run where its latest checkpoint left it, or start it over on purpose.

A resumed run continues with the same step counter, weights, optimizer, scheduler, RNG and batch
source position (``Trainer.load_checkpoint``), serves the restored weights to inference at once,
and keeps ``metrics.jsonl`` to one record per step (``align_metrics``): records after the checkpoint are
dropped (they belong to steps that will be trained again), and the checkpoint's own step gets its record back
from the checkpoint when the run was killed between writing the checkpoint and logging that step.

Versions after a lost host: a step publishes before it checkpoints, so the servers may already serve
versions past the checkpoint's (steps trained, published, then lost with a host). The resumed run restores
the checkpoint's weights under the checkpoint's version (``declare_restore``, then the publish: Ludic's
server accepts that one update going back; ordinary publishes never go back) and trains those steps again
under the same numbers, so a version is a step of the surviving lineage. Items sampled under a lost step's
version count as that step's age; the correction still uses the log-probs they were sampled with.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ludic.distributed.lora_payload import lora_publish_mode
from ludic.distributed.publisher import declare_restore
from ludic.training.parallel.publish import gather_publishable


class ResumeError(RuntimeError):
    """Outputs of an earlier run are in the way and there is no checkpoint to resume from."""


@dataclass(frozen=True)
class Resumed:
    """Where a resumed run starts: the checkpoint's step and the stats its step had when it was saved."""

    step: int
    stats: dict[str, float] = field(default_factory=dict)


def resume_latest(trainer: Any, *, fallback: bool = True) -> int:
    """Load the latest checkpoint into ``trainer`` and publish its weights; returns the step."""
    return resume_checkpoint(trainer, fallback=fallback).step


def resume_checkpoint(trainer: Any, *, fallback: bool = True) -> Resumed:
    """``resume_latest``, also returning the checkpointed step's stats (for ``align_metrics``)."""
    state = trainer.load_checkpoint(fallback=fallback)
    if trainer.publisher is not None:  # inference still holds the initial weights
        mode = lora_publish_mode(trainer.publisher)  # a LoRA run publishing adapters sends the restored ones
        # an FSDP-sharded model: every rank gathers (a collective), rank 0 alone gets the full weights and publishes
        weights = gather_publishable(trainer.model, trainer.param_filter, publish=mode)
        if trainer.ranks.is_main:
            # the servers may already serve a later version (a step publishes before it checkpoints, and the
            # steps after this checkpoint were lost): declared, they take the checkpoint's weights at its version
            declare_restore(trainer.publisher, trainer.step)
            trainer.publisher.publish(weights, version=trainer.step)
    stats = state.get("metadata", {}).get("stats")
    return Resumed(step=trainer.step, stats=dict(stats) if isinstance(stats, Mapping) else {})


@dataclass(frozen=True)
class MetricsAlignment:
    """What ``align_metrics`` changed: records dropped after the checkpoint, and whether its step's came back."""

    dropped: int
    restored: bool


def align_metrics(jsonl: Path, resumed: Resumed, *, log_every: int = 1) -> MetricsAlignment:
    """One record per step up to the checkpoint, none after it.

    A step checkpoints before it logs (its line carries the checkpoint's time), so a kill between the two
    leaves a checkpoint whose step has no record; the resumed run starts after that step and would never
    write one. The checkpoint keeps the step's stats as they were when it saved (``trainer_state.json``
    ``metadata.stats``: everything but the step's ``time/*`` split, which was still running), and that
    record is appended here, so the resumed ``metrics.jsonl`` equals an unbroken run's step for step.
    """
    dropped, logged = _keep_records_until(jsonl, resumed.step)
    due = resumed.step > 0 and resumed.step % max(log_every, 1) == 0
    if not due or not resumed.stats or resumed.step in logged:
        return MetricsAlignment(dropped=dropped, restored=False)
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    with jsonl.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": resumed.step, **resumed.stats}, default=str) + "\n")
    return MetricsAlignment(dropped=dropped, restored=True)


def drop_records_after(jsonl: Path, step: int) -> int:
    """Rewrite ``jsonl`` (atomically) keeping records with ``step <= step``; returns how many were dropped.

    Dropped: records of later steps and lines that are not JSON (one cut short by a kill). Kept as they are:
    every other line, including JSON without an integer ``step`` (not Ludic's to judge), byte for byte.
    """
    return _keep_records_until(jsonl, step)[0]


def _keep_records_until(jsonl: Path, step: int) -> tuple[int, set[int]]:
    """``drop_records_after``, also returning the steps of the records kept."""
    if not jsonl.is_file():
        return 0, set()
    kept, steps, dropped = [], set(), 0
    for line in _read_lines(jsonl):
        readable, record_step = _record_step(line)
        if not readable or (record_step is not None and record_step > step):
            dropped += 1
            continue
        kept.append(line)
        if record_step is not None:
            steps.add(record_step)
    tmp = jsonl.with_name(f".{jsonl.name}.tmp")
    tmp.write_bytes("".join(f"{line}\n" for line in kept).encode("utf-8", errors="surrogateescape"))
    os.replace(tmp, jsonl)
    return dropped, steps


def _read_lines(jsonl: Path) -> list[str]:
    """The file's lines split at ``\\n`` alone (JSON Lines; ``str.splitlines`` would also cut at ``\\u2028`` and
    other breaks a JSON string may hold raw). surrogateescape: bytes that are not UTF-8 (another tool's, or
    a write cut inside a character) read and write back unchanged instead of failing the resume."""
    lines = jsonl.read_bytes().decode("utf-8", errors="surrogateescape").split("\n")  # no newline translation
    return lines[:-1] if lines and lines[-1] == "" else lines


def _record_step(line: str) -> tuple[bool, int | None]:
    """(readable, step): a line that is not JSON is unreadable; a record without an integer step has None."""
    try:
        record = json.loads(line)
    except ValueError:
        return False, None
    step = record.get("step") if isinstance(record, dict) else None
    return True, step if isinstance(step, int) and not isinstance(step, bool) else None


def describe_outputs(paths: list[Path]) -> list[str]:
    """One line per existing output that a fresh start would overwrite."""
    lines = []
    for path in paths:
        if path.is_file() and path.suffix == ".jsonl":
            lines.append(f"{path} ({sum(1 for _ in path.open(encoding='utf-8'))} records)")
        elif path.is_dir():
            lines.append(f"{path}/ ({sum(1 for _ in path.iterdir())} entries)")
        elif path.exists():
            lines.append(str(path))
    return lines


def remove_outputs(paths: list[Path], *, owner_dir: Path, checkpoint_dir: Path | None = None) -> list[Path]:
    """Delete only what an earlier Ludic run wrote (``run_outputs``); refuses, deleting nothing, otherwise."""
    from ludic.training.run_outputs import clean_outputs

    return clean_outputs(paths, owner_dir=owner_dir, checkpoint_dir=checkpoint_dir)
