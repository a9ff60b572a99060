"""A whole XREAD reply decoded in one loop: the usual good entry costs one msgpack call and a few C calls.

``codec.decode_fields`` checks an entry step by step, in small functions that name what is wrong. On a
512-token item those calls (a dozen, ~0.1 us each) cost about three times msgpack's unpacking, so the
batch source decodes a read here instead: per entry, the checks ``decode_fields`` makes of a good entry
are one chain of plain comparisons and C calls (``bytes.find``, ``startswith``), inline, and the item is
built from the checked bytes. An entry the chain does not pass (any kind of bad entry, or a rarer layout:
frozen log-probs, a mask that is not zeros then ones) goes to ``decode_fields`` itself, so the result
and any refusal (reason and message) are the same as ``decode_fields``'s for every entry
(``test_pipeline_read_decoder.py`` checks that on good, unusual and broken entries).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ludic.training.pipeline.codec import (
    _FIELD,
    _LENGTH,
    _NEGATIVE_TOPS,
    _STEP,
    _STEP_HALF,
    MAX_ID_CHARS,
    MAX_VERSION,
    SCHEMA_VERSION,
    BadEntry,
    _msgpack,
    decode_fields,
)
from ludic.training.pipeline.item import PackedSAWItem, PackedTokenLogps
from ludic.training.types import SampleAttachments

Decoded = tuple[str, int | None, PackedSAWItem]


def decode_read(entries: Sequence[Sequence[Any]], run_id: bytes) -> list[Decoded | BadEntry]:
    """``decode_fields(fields, run_id)`` for each ``[id, fields]`` of an XREAD reply, in order; the ``BadEntry``
    it would raise in place of a refused entry's result."""
    unpackb, results = _msgpack().unpackb, []
    for _, fields in entries:
        try:  # an entry as encoded: one field; anything else is decode_fields's to judge
            body = (
                unpackb(fields[1], raw=False, strict_map_key=True)
                if len(fields) == 2 and fields[0] == _FIELD
                else None
            )
        except Exception:
            body = None
        if type(body) is list and len(body) == _LENGTH and body[0] == SCHEMA_VERSION and body[1] == run_id:
            _, _, item_id, version, weight, meta, ids, attention, action, actor, token_weights, frozen = body
            n = len(ids) >> 2 if type(ids) is bytes else 0
            # NaN and inf: x - x is NaN, not 0. Masks: attention all ones (the second half of _STEP), action
            # zeros then ones (a slice of _STEP, as codec._ones). Floats: see codec._floats (top bytes); log-probs
            # all negative: every top byte in 0x80-0xFE (codec._logps; zeros and the rest go to decode_fields)
            if not (
                type(item_id) is not str or len(item_id) > MAX_ID_CHARS
                or (version is not None and (type(version) is not int or not 0 <= version <= MAX_VERSION))
                or type(weight) is not float or weight - weight != 0.0
                or type(meta) is not dict or type(frozen) is not dict or frozen
                or ("policy_version" in meta and meta["policy_version"] is not version)
                or type(attention) is not bytes or type(action) is not bytes
                or n == 0 or len(ids) & 3 or len(attention) != n or len(action) != n
                or not _STEP.startswith(attention, _STEP_HALF)
                or (first := action.find(1)) < 0 or first > _STEP_HALF or n - first > _STEP_HALF
                or not _STEP.startswith(action, _STEP_HALF - first)
                or (actor is not None and (type(actor) is not bytes or len(actor) != (n - first) << 2
                                           or actor[3::4].translate(None, _NEGATIVE_TOPS)))
                or (token_weights is not None and (type(token_weights) is not bytes
                                                   or len(token_weights) != (n - first) << 3
                                                   or 0x7F in (top := token_weights[7::8]) or 0xFF in top))
            ):  # fmt: skip
                arrays = {"input_ids": ids, "attention_mask": attention, "action_mask": action}
                if token_weights is not None:
                    arrays["token_weights"] = token_weights
                logps = None if actor is None else PackedTokenLogps.of(actor)
                item = PackedSAWItem.of(
                    arrays, weight=weight, meta=meta, attachments=SampleAttachments(logps, {})
                )
                results.append((item_id, version, item))
                continue
        try:
            results.append(decode_fields(fields, run_id))
        except BadEntry as exc:
            results.append(exc)
    return results
