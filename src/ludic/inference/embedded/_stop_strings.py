"""Stop strings, matched incrementally: each step decodes a few tokens and scans a short window.

Decoding a row's whole completion and searching all of it for every stop string after each token
costs O(tokens x stops) per step (quadratic over a completion). Here each row keeps its text so far
and decodes only the tokens since the last stable point (vLLM's detokenizer offsets: a token that
ends mid UTF-8 character waits for the next); a stop string can then only newly appear in the last
``len(new piece) + len(stop) - 1`` characters, so that window is all a step scans. The request's
stop strings are bounded (``sampling.MAX_STOP_STRINGS``, ``MAX_STOP_CHARS``), so a step's work is too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_PENDING_TOKENS = 4
"""Tokens a row waits for a whole character before taking the decoded text as it is (a UTF-8
character is at most 4 bytes, so a longer wait means bytes that never form one)."""


def find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Where the earliest stop string starts in ``text`` (None: none there)."""
    positions = [p for p in (text.find(s) for s in stops) if p >= 0]
    return min(positions) if positions else None


@dataclass
class _RowText:
    """One row's completion so far: its ids, its decoded text, and where decoding resumes."""

    ids: list[int] = field(default_factory=list)
    text: str = ""
    prefix: int = 0  # decode from here (a token of context, so a leading space decodes right)
    read: int = 0  # ids before this are already in ``text``


class StopMatcher:
    """Stop strings of the rows that have them, checked after each new token of each row."""

    def __init__(self, tokenizer: Any, eos_ids: set[int], stops: list[tuple[str, ...]]) -> None:
        self.tokenizer, self.eos_ids, self.stops = tokenizer, eos_ids, stops
        self.rows = {i: _RowText() for i, s in enumerate(stops) if s}
        self.cut: dict[int, int] = {}  # row -> where its stop string starts in the decoded text

    def __bool__(self) -> bool:
        return bool(self.rows)

    def add(self, i: int, token: int) -> bool:
        """Append ``token`` to row ``i``; True once the row's text holds one of its stop strings."""
        row = self.rows.get(i)
        if row is None or token in self.eos_ids:  # EOS ends a row before its stop strings
            return False
        row.ids.append(token)
        piece = self._new_text(row)
        if not piece:
            return False
        row.text += piece
        stops, text = self.stops[i], row.text
        hits = [p for p in (text.find(s, max(0, len(text) - len(piece) - len(s) + 1)) for s in stops) if p >= 0]
        if not hits:
            return False
        # Where the final text (one full decode, as the response makes it) has the stop: once per row.
        full = self.tokenizer.decode(row.ids, skip_special_tokens=False)
        at = find_stop(full, stops)
        self.cut[i] = at if at is not None else min(hits)
        return True

    def _new_text(self, row: _RowText) -> str:
        """The text the tokens since ``row.read`` add (empty while they end mid-character)."""
        decode = self.tokenizer.decode
        before = decode(row.ids[row.prefix : row.read], skip_special_tokens=False)
        after = decode(row.ids[row.prefix :], skip_special_tokens=False)
        if after.endswith("\ufffd") and len(row.ids) - row.read < MAX_PENDING_TOKENS:
            return ""
        piece = after[len(before) :]
        row.prefix, row.read = row.read, len(row.ids)
        return piece
