"""Falling back to an older checkpoint, and what that costs a pipeline run.

In pipeline mode the batch source's stream is trimmed (``XTRIM``) once a checkpoint covering the
consumed entries is on disk. A newer checkpoint that then fails to load leaves those entries gone:
resuming from an older one would skip them without a word. So a fallback across a stream cursor is
refused unless ``CheckpointConfig.fallback_may_skip_items`` says the run may skip them, and the error
says how many items that would be.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ludic.training.checkpoint._files import STATE, STEP_DIR, parse_trainer_state
from ludic.training.checkpoint._io import CheckpointLoadError

_log = logging.getLogger("ludic.training.checkpoint.manager")


def _stream_cursor(state: dict[str, Any]) -> dict[str, Any] | None:
    """The pipeline source's saved cursor (``last_id`` + ``consumed``), None for other batch sources."""
    source = state.get("metadata", {}).get("batch_source")
    if isinstance(source, dict) and "last_id" in source and isinstance(source.get("consumed"), int):
        return source
    return None


def _newer_consumed(output_dir: Path, older_step: int) -> int | None:
    """The most stream items any checkpoint newer than ``older_step`` consumed; None when one is unreadable."""
    most = 0
    for p in output_dir.iterdir() if output_dir.is_dir() else ():
        m = STEP_DIR.match(p.name)
        if not m or int(m.group(1)) <= older_step or not (p / STATE).is_file():
            continue
        try:
            cursor = _stream_cursor(parse_trainer_state(p / STATE))
        except CheckpointLoadError:
            return None
        if cursor is not None:
            most = max(most, cursor["consumed"])
    return most


def check_fallback_skip(output_dir: Path, older: Path, older_state: dict[str, Any], *, allow: bool) -> None:
    """Refuse (or, when ``allow``, warn about) falling back to ``older`` if stream items would be skipped."""
    cursor = _stream_cursor(older_state)
    if cursor is None:
        return
    newer = _newer_consumed(output_dir, older_state["step"])
    if newer is not None and newer <= cursor["consumed"]:
        return
    count = "an unknown number of" if newer is None else str(newer - cursor["consumed"])
    what = (
        f"falling back to {older} (step {older_state['step']}, {cursor['consumed']} items consumed) would skip "
        f"{count} pipeline items: a newer checkpoint consumed them and the stream was trimmed after it was saved"
    )
    if not allow:
        raise CheckpointLoadError(
            f"{what}. Repair or remove the newer checkpoint, or set [checkpoint] fallback_may_skip_items = true "
            "(CheckpointConfig(fallback_may_skip_items=True)) to resume without those items"
        )
    _log.warning("%s (allowed by fallback_may_skip_items)", what)
