"""SAW items as Redis stream entries, without pickle.

A compromised queue must not be able to run code in the trainer, so an entry is plain data: one stream
field, ``item``, holding a flat msgpack array of 12 elements (schema 3)::

    [3, run, id, policy_version, weight, meta,
     input_ids, attention_mask, action_mask, actor_logps | nil, token_weights | nil, {key: frozen_logps}]

- ``3``: the schema version (an int); ``run``: the run id (bin, its UTF-8 bytes); ``id``: the item id
  (str); ``policy_version``: int or nil; ``weight``: a float (float64); ``meta``: a map of msgpack types.
- The per-token arrays, each bin holding bare little-endian values, their dtype fixed by position and
  their length implied by the byte count: ``input_ids`` ``<i4``; ``attention_mask`` and ``action_mask``
  ``|u1`` (0 or 1), one entry per token; ``actor_logps`` ``<f4`` and ``token_weights`` ``<f8``, one entry
  per action token, or nil; the last element maps each ``attachments.frozen_logps`` key (str) to its
  ``<f4`` log-probs, one per action token (an empty map for none).

Every later schema must keep the first two elements (an array starting ``[version, run, ...]``), so an
entry of another version or another run is told apart from a broken one: they count as
``unknown_schema`` and ``foreign``. Decoding refuses (``BadEntry``, naming the reason the batch source
counts) a missing ``item`` field, an undecodable body or one of another shape, a wrong type, or a byte
count that is not a multiple of the itemsize (``malformed``); a cut body (``truncated``); and arrays whose
lengths disagree, masks holding anything but 0 and 1, an all-zero attention or action mask (nothing to
train on), NaN or inf among the floats or as the weight, a positive log-prob among ``actor_logps`` or the
frozen log-probs (a probability above 1: the importance ratio against it is meaningless), a
``policy_version`` outside ``[0, 2**63)`` or an id longer than ``MAX_ID_CHARS``, an empty item
(``invalid``). Other stream fields beside ``item`` are ignored. The checks are a handful of vectorised calls on the packed bytes, and the result is a
``PackedSAWItem`` that builds its Python lists on first read.

Schemas 1 and 2 (three stream fields ``v``, ``run``, ``data``: the version, the run, a msgpack map; an
entry with a ``v`` field and no ``item`` field) are refused as ``unknown_schema``, like any version this trainer does not read: restart old actors with this
version.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from ludic.training.pipeline.item import PackedSAWItem, PackedTokenLogps
from ludic.training.pipeline.redis_server import REDIS_EXTRA_HINT
from ludic.training.types import SampleAttachments, SAWItem

SCHEMA_VERSION = 3
FIELD = "item"
"""The stream field an entry's body travels in."""
_FIELD = FIELD.encode()
_LENGTH = 12
"""Elements in a schema-3 body."""
_STRUCT = {"<i4": "i", "<f4": "f", "<f8": "d"}  # struct codes, standard sizes under "<"
_F4, _F8 = np.dtype("<f4"), np.dtype("<f8")
_STEP_HALF = 1 << 16
_STEP = bytes(_STEP_HALF) + b"\1" * _STEP_HALF
"""64 Ki zeros, then 64 Ki ones: a mask of zeros then ones is the slice starting as many zeros before the middle."""
MAX_ID_CHARS = 256
"""Longest item id taken: ids are the producer's (a uuid4 hex: 32); the batch source keeps thousands of them."""
MAX_VERSION = 2**63 - 1
"""Largest policy version taken (int64, as tensors and JSON readers hold it)."""
_NEGATIVE_TOPS = bytes(range(0x80, 0xFF))
"""Top bytes (little-endian: the last of each float32) of negative floats down to -2**127, and of -0.0. When
``top.translate(None, _NEGATIVE_TOPS)`` is empty every value is negative; else numpy looks closer (a zero, a
positive, NaN, inf, or a finite value beyond -2**127)."""


class BadEntry(ValueError):
    """A stream entry the trainer refuses; ``reason`` is the counter it goes under."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class DecodedEntry:
    """One good entry: its producer-assigned id, the policy version that sampled it, the item."""

    item_id: str
    policy_version: int | None
    item: SAWItem


@functools.cache  # the module, looked up once: a function-level import costs ~50 ns a call
def _msgpack() -> Any:
    try:
        import msgpack
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"pipeline RL needs msgpack; {REDIS_EXTRA_HINT}") from exc
    return msgpack


def encode_item(item: SAWItem, *, run_id: str, item_id: str) -> dict[str, bytes]:
    """Stream fields for one item; ``meta`` must hold only msgpack types (TypeError names the key)."""
    version = item.meta.get("policy_version")
    actor = item.attachments.actor_logps
    body = [
        SCHEMA_VERSION,
        run_id.encode(),
        item_id,
        version if isinstance(version, int) else None,
        float(item.weight),
        item.meta,
        _packed("input_ids", "<i4", item.input_ids),
        _packed("attention_mask", "|u1", item.attention_mask),
        _packed("action_mask", "|u1", item.action_mask),
        None if actor is None else _packed("actor_logps", "<f4", actor.token_logps),
        None if item.token_weights is None else _packed("token_weights", "<f8", item.token_weights),
        {key: _packed(f"frozen_logps[{key!r}]", "<f4", v) for key, v in item.attachments.frozen_logps.items()},
    ]
    try:
        data = _msgpack().packb(body, use_bin_type=True)
    except TypeError as exc:
        bad = [k for k, v in item.meta.items() if not _packable(v)]
        raise TypeError(f"SAWItem.meta keys {bad} hold values msgpack cannot encode ({exc})") from exc
    return {FIELD: data}


def _packed(name: str, dtype: str, values: Any) -> bytes | bytearray:
    """``values`` as little-endian ``dtype``. From Python lists, ``bytearray`` (masks) and ``struct.pack`` (ints,
    floats) are the fastest packers: ~3x ``array.array`` or numpy, ~7x ``bytes()`` for a 4,096-token item."""
    try:
        if dtype == "|u1":
            # 0/1 each: one byte per entry (msgpack packs it as bin)
            return bytearray(values)
        # "<": little-endian, standard sizes
        return struct.pack(f"<{len(values)}{_STRUCT[dtype]}", *values)
    except (OverflowError, TypeError, ValueError, struct.error) as exc:
        raise ValueError(f"SAWItem {name} does not fit {dtype}: {exc}") from exc


def _packable(value: Any) -> bool:
    try:
        _msgpack().packb(value, use_bin_type=True)
    except (TypeError, ValueError):
        return False
    return True


def decode_entry(fields: dict[bytes, bytes], *, run_id: str | bytes) -> DecodedEntry:
    """The item in one stream entry, or BadEntry saying why not."""
    run_b = run_id if isinstance(run_id, bytes) else run_id.encode()
    return DecodedEntry(*decode_fields([part for field in fields.items() for part in field], run_b))


def decode_fields(fields: Sequence[bytes], run_id: bytes) -> tuple[str, int | None, PackedSAWItem]:
    """``decode_entry`` for the entry's fields as XREAD gives them (``[name, value, ...]``), with no dict and no
    ``DecodedEntry`` built: ``(item_id, policy_version, item)``, or BadEntry saying why not."""
    if len(fields) == 2 and fields[0] == _FIELD:  # as encoded
        return _decode(fields[1], run_id)
    named = dict(zip(fields[0::2], fields[1::2], strict=False))
    if _FIELD in named:
        return _decode(named[_FIELD], run_id)
    if b"v" in named:  # schemas 1 and 2: the version in a field of its own
        raise BadEntry("unknown_schema", f"schema {named[b'v'][:20]!r}, this trainer reads {SCHEMA_VERSION}")
    raise BadEntry("malformed", f"no {FIELD!r} field (fields: {sorted(named)[:5]})")


def _decode(data: bytes, run_id: bytes) -> tuple[str, int | None, PackedSAWItem]:
    body = _unpack(data, run_id)
    if type(body) is not list or len(body) != _LENGTH or body[0] != SCHEMA_VERSION or body[1] != run_id:
        _refuse_shape(body, run_id)
    _, _, item_id, version, weight, meta, ids, attention, action, actor, token_weights, frozen = body
    if type(item_id) is not str or not (version is None or type(version) is int):
        raise BadEntry("malformed", f"id {item_id!r:.40} / policy_version {version!r:.40}")
    if len(item_id) > MAX_ID_CHARS or not (version is None or 0 <= version <= MAX_VERSION):
        raise BadEntry("invalid", f"id of {len(item_id)} chars (at most {MAX_ID_CHARS}) / policy_version {version!r:.40} (0 to 2**63-1)")  # fmt: skip
    if type(weight) is not float or type(meta) is not dict or type(frozen) is not dict:
        raise BadEntry("malformed", f"weight {weight!r:.40} / meta {type(meta).__name__} / frozen log-probs {type(frozen).__name__}")  # fmt: skip
    if not math.isfinite(weight):
        raise BadEntry("invalid", f"weight must be a finite number, got {weight!r}")
    meta_version = meta.get("policy_version", version)  # encode_item writes the meta's int version; stats read it
    if meta_version is not version and (type(meta_version) is not int or meta_version != version):
        raise BadEntry("invalid", f"meta policy_version {meta_version!r:.40} is not the entry's {version!r}")
    n_action = _action_tokens(ids, attention, action)
    arrays = {"input_ids": ids, "attention_mask": attention, "action_mask": action}
    if token_weights is not None:
        arrays["token_weights"] = _floats("token_weights", token_weights, 8, n_action)
    if actor is not None:
        actor = PackedTokenLogps.of(_logps("actor_logps", actor, n_action))
    attachments = SampleAttachments(actor, _frozen(frozen, n_action) if frozen else {})
    return item_id, version, PackedSAWItem.of(arrays, weight=weight, meta=meta, attachments=attachments)


def _action_tokens(ids: Any, attention: Any, action: Any) -> int:
    """How many action tokens, after checking the per-token arrays: bin (else ``malformed``), whole ``<i4`` ids
    (else ``malformed``), one mask entry per token and only 0s and 1s in the masks (else ``invalid``)."""
    if type(ids) is not bytes or type(attention) is not bytes or type(action) is not bytes or len(ids) & 3:
        _refuse_array("input_ids", ids, 4)
        _refuse_array("attention_mask", attention, 1)
        _refuse_array("action_mask", action, 1)
    n = len(ids) >> 2
    if n == 0 or len(attention) != n or len(action) != n:
        raise BadEntry("invalid", f"input_ids has {n} entries, attention_mask {len(attention)}, action_mask {len(action)}")  # fmt: skip
    n_action, n_attended = _ones(action), _ones(attention)
    if n_action < 0 or n_attended < 0:
        raise BadEntry("invalid", "a mask holds values other than 0 and 1")
    if n_action == 0 or n_attended == 0:
        raise BadEntry("invalid", f"{'action_mask' if n_action == 0 else 'attention_mask'} is all zeros: nothing to train on")  # fmt: skip
    return n_action


def _unpack(data: bytes, run_id: bytes) -> Any:
    """The decoded body; on a body msgpack cannot decode, BadEntry: ``unknown_schema`` or ``foreign`` where
    its first two elements say so, else ``truncated`` (a cut) or ``malformed``."""
    msgpack = _msgpack()
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except msgpack.ExtraData as exc:
        reason, detail = "malformed", f"trailing bytes after the msgpack body ({exc})"
    except ValueError as exc:  # msgpack raises ValueError("Unpack failed: incomplete input") on a cut
        reason = "truncated" if "incomplete" in str(exc) else "malformed"
        detail = f"msgpack: {exc}"
    except Exception as exc:  # FormatError, StackError, ...: anything else undecodable
        reason, detail = "malformed", f"msgpack: {type(exc).__name__}: {exc}"
    _check_head(_head(data), run_id)
    raise BadEntry(reason, detail)


def _head(data: bytes) -> list[Any]:
    """Up to the first two elements of an array body that may not decode as a whole ([] where none do)."""
    head: list[Any] = []
    try:
        unpacker = _msgpack().Unpacker(raw=False, strict_map_key=True, max_buffer_size=max(len(data), 1))
        unpacker.feed(data)
        for _ in range(min(unpacker.read_array_header(), 2)):
            head.append(unpacker.unpack())
    except Exception:  # not an array, or cut within its head: the head says nothing more
        pass
    return head


def _check_head(head: list[Any], run_id: bytes) -> None:
    """BadEntry ``unknown_schema`` or ``foreign`` where the body's first elements (version, run) say so."""
    if head and (type(head[0]) is not int or head[0] != SCHEMA_VERSION):
        raise BadEntry("unknown_schema", f"schema {head[0]!r:.20}, this trainer reads {SCHEMA_VERSION}")
    if len(head) > 1 and head[1] != run_id:
        raise BadEntry("foreign", f"entry of run {head[1]!r:.64}, this run is {run_id.decode()!r}")


def _refuse_shape(body: Any, run_id: bytes) -> NoReturn:
    """Why a decoded body is not a schema-3 item of this run."""
    if type(body) is not list or not body:
        raise BadEntry("malformed", f"body is {type(body).__name__} {body!r:.20}, expected a non-empty array")
    _check_head(body[:2], run_id)
    raise BadEntry("malformed", f"body has {len(body)} elements, expected {_LENGTH}")


def _refuse_array(name: str, raw: Any, itemsize: int) -> None:
    """BadEntry ``malformed`` unless ``raw`` is bytes holding a whole number of ``itemsize``-byte entries."""
    if type(raw) is not bytes:
        raise BadEntry("malformed", f"{name} is {type(raw).__name__}, expected bin")
    if len(raw) % itemsize:
        raise BadEntry("malformed", f"{name}: {len(raw)} bytes, not a multiple of its entries' {itemsize}")


def _floats(name: str, raw: Any, itemsize: int, n_action: int) -> bytes:
    """``raw`` after checking it holds one finite float of ``itemsize`` bytes per action token.

    NaN and inf have every exponent bit set, so the top byte of each is 0x7F or 0xFF (sign bit): when no top
    byte is, all are finite (two memchr scans); else numpy looks closer (finite floats with such a top byte
    have |x| >= 2**127 in float32, 2**1023 in float64)."""
    if type(raw) is not bytes or len(raw) % itemsize:
        _refuse_array(name, raw, itemsize)
    if len(raw) != n_action * itemsize:
        raise BadEntry("invalid", f"{name} has {len(raw) // itemsize} entries, action_mask marks {n_action} action tokens")  # fmt: skip
    top = raw[itemsize - 1 :: itemsize]  # little-endian: the last byte of each holds the sign and high exponent bits
    if (0x7F in top or 0xFF in top) and not np.isfinite(np.frombuffer(raw, dtype=_F4 if itemsize == 4 else _F8)).all():
        raise BadEntry("invalid", f"{name} holds NaN or inf")
    return raw


def _logps(name: str, raw: Any, n_action: int) -> bytes:
    """``raw`` after checking it holds one finite float32 log-prob, at most 0, per action token."""
    raw = _floats(name, raw, 4, n_action)
    if raw[3::4].translate(None, _NEGATIVE_TOPS):  # some are not negative: +0.0 is fine, a positive is not
        values = np.frombuffer(raw, dtype=_F4)
        if not (values <= 0).all():
            bad = values[~(values <= 0)]
            raise BadEntry("invalid", f"{name} holds {bad.size} positive log-prob(s), e.g. {float(bad[0])!r}: a log-prob is at most 0")  # fmt: skip
    return raw


def _frozen(frozen: dict[Any, Any], n_action: int) -> dict[str, list[float]]:
    """The frozen models' log-probs by key, each checked like ``actor_logps``."""
    lists = {}
    for key, raw in frozen.items():
        if type(key) is not str:
            raise BadEntry("malformed", f"frozen log-probs key {key!r:.40} is not a str")
        name = f"frozen_logps[{key!r}]"
        lists[key] = np.frombuffer(_logps(name, raw, n_action), dtype=_F4).tolist()
    return lists


def _ones(mask: bytes) -> int:
    """How many bytes of ``mask`` are 1, or -1 when one is neither 0 nor 1. The usual mask, zeros then ones (a
    prompt, then its completion; or all ones), is recognised by one comparison with a slice of ``_STEP``
    (memcmp, no copy); any other is scanned twice (``translate`` deletes the 0s and 1s: anything left is
    neither; then ``count``)."""
    first = mask.find(1)
    ones = len(mask) - first
    if 0 <= first <= _STEP_HALF and ones <= _STEP_HALF and _STEP.startswith(mask, _STEP_HALF - first):
        return ones
    return -1 if mask.translate(None, b"\0\1") else mask.count(1)
