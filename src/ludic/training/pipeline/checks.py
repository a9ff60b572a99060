"""What a decoded stream entry must also satisfy before the trainer takes it: checks against the model.

The codec (``codec``) checks that an entry is a well-formed SAW item; these check that the
trainer can train on it without crashing or producing a non-finite step. One bad entry must fail only
itself: without these, an out-of-vocabulary token id crashes the step's embedding lookup (and again on
every resume, since the entry is never trimmed), and one weight of 1e300 or a temperature of 1e-45 turns
the whole step's loss non-finite, so the batch's good items are consumed and never trained. An entry that
fails is refused with a ``BadEntry`` whose reason the batch source counts (``pipeline/skipped_<reason>``):

- ``out_of_vocab``: a token id outside ``[0, vocab_size)``;
- ``extreme_weight``: ``weight`` or a token weight with ``|w| > max_abs_weight``;
- ``bad_temperature``: ``meta["sampling_temperature"]`` NaN, inf, negative, or in ``(0, min_temperature)``
  or above ``max_temperature`` (0 means greedy, scored at T = 1, as everywhere in Ludic), or not a number
  at all (``"0.7"``, ``true``: the trainer would score it at T = 1, not the T it was sampled at);
- ``nucleus_sampled``: ``meta["sampling_top_p"] < 1`` (or NaN, or not a number). Its actor log-probs are of the
  nucleus-truncated distribution, which the trainer cannot recompute, so ratio-based losses refuse the
  whole batch (``validate_actor_logps`` raises). ``allow_nucleus=True`` lets them through for losses
  without importance ratios.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ludic.training.layout import token_arrays
from ludic.training.pipeline.codec import BadEntry
from ludic.training.pipeline.item import wire_arrays
from ludic.training.types import SAWItem

REASONS = ("out_of_vocab", "extreme_weight", "bad_temperature", "nucleus_sampled")


@dataclass(frozen=True)
class EntryLimits:
    """The bounds a popped item is held to."""

    vocab_size: int
    """Rows of the model's input embedding (``model.get_input_embeddings().num_embeddings``)."""
    max_abs_weight: float = 1e6
    """Largest ``|weight|`` and ``|token weight|`` taken (advantages are O(1); 1e300 overflows the loss)."""
    min_temperature: float = 1e-3
    """Smallest non-zero sampling temperature taken: the trainer divides the logits by it."""
    max_temperature: float = 1e3
    """Largest sampling temperature taken."""
    allow_nucleus: bool = False
    """Take items sampled with ``top_p < 1`` (only for losses that use no importance ratio)."""

    def __post_init__(self) -> None:
        if type(self.vocab_size) is not int or self.vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int (the model's embedding rows), got {self.vocab_size!r}")  # fmt: skip
        if not 0 < self.max_abs_weight < math.inf:
            raise ValueError(f"max_abs_weight must be finite and > 0, got {self.max_abs_weight!r}")
        if not 0 < self.min_temperature <= self.max_temperature < math.inf:
            raise ValueError(
                f"need 0 < min_temperature <= max_temperature < inf, got {self.min_temperature!r}, "
                f"{self.max_temperature!r}"
            )


def check_item(item: SAWItem, limits: EntryLimits) -> None:
    """Raise ``BadEntry`` naming the first limit ``item`` breaks (see the module docstring)."""
    _check_token_ids(item, limits.vocab_size)
    _check_weights(item, limits.max_abs_weight)
    _check_sampling(item.meta, limits)


def refusals(items: list[SAWItem], limits: EntryLimits) -> list[BadEntry | None]:
    """``check_item``'s verdict on each of ``items`` (None: taken). The whole list (a read) is checked at once,
    a few vectorised calls and one plain loop (per item, the checks cost about as much as decoding); only
    where that finds an offender is each item checked alone, to name it."""
    if _all_within(items, limits):
        return [None] * len(items)
    verdicts: list[BadEntry | None] = []
    for item in items:
        try:
            check_item(item, limits)
            verdicts.append(None)
        except BadEntry as exc:
            verdicts.append(exc)
    return verdicts


_REAL = (int, float)


def _all_within(items: list[SAWItem], limits: EntryLimits) -> bool:
    """Whether every item passes ``check_item``; False also where this cannot tell (an item that is not packed,
    a meta value of an unexpected type): ``check_item`` then decides."""
    ids, token_weights = wire_arrays(items, "input_ids"), wire_arrays(items, "token_weights")
    if ids is None or token_weights is None:
        return False
    # the ids of the whole read as one uint32 array: a negative int32 is >= 2**31, so one max() checks both ends
    joined = np.frombuffer(b"".join(ids), dtype=np.uint32)
    if joined.size and int(joined.max()) >= limits.vocab_size:
        return False
    bound, lo, hi = limits.max_abs_weight, limits.min_temperature, limits.max_temperature
    present = [w for w in token_weights if w is not None]
    if present and not float(np.abs(np.frombuffer(b"".join(present), dtype=np.float64)).max()) <= bound:
        return False
    nucleus = limits.allow_nucleus
    for item in items:  # NaN fails every comparison below
        meta = item.meta
        t, top_p = meta.get("sampling_temperature"), meta.get("sampling_top_p")
        if (
            not -bound <= item.weight <= bound
            or (t is not None and not (type(t) in _REAL and (t == 0 or lo <= t <= hi)))
            or (top_p is not None and not nucleus and not (type(top_p) in _REAL and top_p >= 1.0))
        ):
            return False
    return True


def _check_token_ids(item: SAWItem, vocab_size: int) -> None:
    ids = np.asarray(token_arrays.values(item, "input_ids"))
    if not ids.size:
        return
    # read as uint32 a negative int32 is >= 2**31: one max() checks both ends (no copy)
    if ids.dtype == np.int32:
        top = int(ids.view(np.uint32).max())
    else:  # a list-backed item
        top = vocab_size if int(ids.min()) < 0 else int(ids.max())
    if top >= vocab_size:
        bad = ids[(ids < 0) | (ids >= vocab_size)]
        raise BadEntry(
            "out_of_vocab", f"token id {int(bad[0])} is outside [0, {vocab_size}) ({bad.size} such)"
        )


def _check_weights(item: SAWItem, bound: float) -> None:
    if not abs(item.weight) <= bound:
        raise BadEntry("extreme_weight", f"weight {item.weight!r} is beyond +-{bound:g}")
    weights = token_arrays.values(item, "token_weights")
    if weights is None:
        return
    weights = np.asarray(weights, dtype=np.float64)
    if weights.size and not float(np.abs(weights).max()) <= bound:
        raise BadEntry("extreme_weight", f"a token weight ({float(np.abs(weights).max())!r}) is beyond +-{bound:g}")  # fmt: skip


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_sampling(meta: dict[str, Any], limits: EntryLimits) -> None:
    t = meta.get("sampling_temperature")
    if t is not None and not _number(t):
        raise BadEntry("bad_temperature", f"sampling_temperature {t!r:.40} is not a number")
    if _number(t) and t != 0 and not limits.min_temperature <= t <= limits.max_temperature:
        raise BadEntry(
            "bad_temperature",
            f"sampling_temperature {t!r}: expected 0 (greedy) or within "
            f"[{limits.min_temperature:g}, {limits.max_temperature:g}]",
        )
    top_p = meta.get("sampling_top_p")
    if top_p is not None and not _number(top_p) and not limits.allow_nucleus:
        raise BadEntry("nucleus_sampled", f"sampling_top_p {top_p!r:.40} is not a number: whether the log-probs are of a truncated distribution is unknown")  # fmt: skip
    if _number(top_p) and not limits.allow_nucleus and not top_p >= 1.0:
        raise BadEntry(
            "nucleus_sampled",
            f"sampling_top_p {top_p!r} < 1: its log-probs are of the truncated distribution the trainer "
            "cannot recompute; sample with top_p=1.0 (or allow_nucleus=True for losses without ratios)",
        )
