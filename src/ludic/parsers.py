"""Parsers turn raw model text into an action plus an intrinsic format reward."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ParseResult:
    """``action`` is None on failure; ``obs`` is then the feedback shown to the agent."""

    action: str | None
    reward: float = 0.0
    obs: str | None = None


Parser = Callable[[str], ParseResult]
