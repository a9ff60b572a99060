"""The tokenizer saved beside a checkpoint's weights, so the folder is a whole model (``ludic eval --model``
and ``from_pretrained`` find its chat template there)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_tokenizer(tokenizer: Any, folder: Path) -> None:
    """``tokenizer.save_pretrained(folder)`` when a tokenizer is given; a checkpoint without one is still whole
    for resuming (the run's config names its tokenizer)."""
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
