"""Reading back an evaluation's summary (``eval/eval_step_<n>_summary.json``), for the plot and a resumed run.

A past evaluation's file may be empty, cut short or not an object (a crash while writing, a hand edit); what
reads it back must not stop on it: it gets ``None`` and a warning naming the file and what follows from it.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

_log = logging.getLogger(__name__)

EVAL_SUMMARY = re.compile(r"eval_step_(-?\d+)_summary\.json")  # the evaluator's file name; the step may be -1


def summary_path(eval_dir: Path, step: int) -> Path:
    """Where the evaluation at ``step`` wrote its summary."""
    return eval_dir / f"eval_step_{step}_summary.json"


def read_eval_summary(path: Path, consequence: str) -> dict[str, Any] | None:
    """The summary's JSON object; ``None`` when it cannot be read or is not an object, with a warning naming
    ``path`` and ``consequence`` (what the caller does without it, e.g. "left out of the plot")."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        _log.warning("%s: %s, not a readable evaluation summary (%s)", path, consequence, exc)
        return None
    if not isinstance(summary, dict):
        _log.warning("%s: %s, a JSON %s, not an evaluation summary (an object)", path, consequence,
                     type(summary).__name__)  # fmt: skip
        return None
    return summary
