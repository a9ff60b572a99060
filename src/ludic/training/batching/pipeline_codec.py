"""SAW items as Redis stream entries, without pickle.

A compromised queue must not be able to run code in the trainer, so an entry is plain data: three
stream fields, ``v`` (schema version), ``run`` (the run id) and ``data``, a msgpack map::

    {"id": str, "policy_version": int | None, "weight": float, "meta": {...msgpack types...},
     "tokens": {name: [dtype, length, little-endian bytes], ...}}

``tokens`` holds the per-token arrays: ``input_ids`` (``<i4``), ``attention_mask`` and ``action_mask``
(``|u1``), and optionally ``actor_logps`` and ``frozen/<key>`` (``<f4``) and ``token_weights`` (``<f8``),
each one entry per action token. Decoding
checks every dtype against the name's, every byte count against ``length`` (either wrong: ``malformed``),
then lengths across arrays, mask values and finite floats (``invalid``), with vectorised calls on the
packed bytes, and returns a ``PackedSAWItem`` that builds its Python lists on first read. ``BadEntry``
names the reason the batch source counts: ``malformed``, ``unknown_schema``, ``foreign``, ``truncated``
or ``invalid``. Schema 1 (the arrays as bare bytes, before lengths and dtypes were recorded) is
refused as ``unknown_schema`` like any other: restart old actors with this version.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ludic.distributed.redis_server import REDIS_EXTRA_HINT
from ludic.training.batching.pipeline_item import PackedSAWItem, PackedTokenLogps
from ludic.training.types import SampleAttachments, SAWItem

SCHEMA_VERSION = 2
_SCHEMA = str(SCHEMA_VERSION).encode()
FROZEN_PREFIX = "frozen/"
"""``attachments.frozen_logps[key]`` travels as ``tokens["frozen/<key>"]``."""
DTYPES = {
    "input_ids": "<i4", "attention_mask": "|u1", "action_mask": "|u1", "actor_logps": "<f4", "token_weights": "<f8",
}  # fmt: skip
"""The dtype each per-token array is written with and must be read with (``frozen/*``: ``<f4``)."""
_ITEMSIZE = {"<i4": 4, "|u1": 1, "<f4": 4, "<f8": 8}
_NP = {dtype: np.dtype(dtype) for dtype in _ITEMSIZE}
_STRUCT = {"<i4": "i", "<f4": "f", "<f8": "d"}  # struct codes, standard sizes under "<"
_SPEC = {name: (dtype, _ITEMSIZE[dtype]) for name, dtype in DTYPES.items()}
_FROZEN_SPEC = ("<f4", 4)
_IDS_AND_MASKS = frozenset(("input_ids", "attention_mask", "action_mask"))
_STEP_HALF = 1 << 16
_STEP = bytes(_STEP_HALF) + b"\1" * _STEP_HALF
"""64 Ki zeros, then 64 Ki ones: a mask of zeros then ones is the slice starting as many zeros before the middle."""


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
    tokens = {
        "input_ids": _packed("input_ids", item.input_ids),
        "attention_mask": _packed("attention_mask", item.attention_mask),
        "action_mask": _packed("action_mask", item.action_mask),
    }
    if actor is not None:
        tokens["actor_logps"] = _packed("actor_logps", actor.token_logps)
    for key, values in item.attachments.frozen_logps.items():
        tokens[FROZEN_PREFIX + key] = _packed(FROZEN_PREFIX + key, values)
    if item.token_weights is not None:
        tokens["token_weights"] = _packed("token_weights", item.token_weights)
    body = {
        "id": item_id,
        "policy_version": version if isinstance(version, int) else None,
        "weight": float(item.weight),
        "meta": item.meta,
        "tokens": tokens,
    }
    try:
        data = _msgpack().packb(body, use_bin_type=True)
    except TypeError as exc:
        bad = [k for k, v in item.meta.items() if not _packable(v)]
        raise TypeError(f"SAWItem.meta keys {bad} hold values msgpack cannot encode ({exc})") from exc
    return {"v": _SCHEMA, "run": run_id.encode(), "data": data}


def _packed(name: str, values: Any) -> list[Any]:
    """``[dtype, length, bytes]``. From Python lists, ``bytearray`` (masks) and ``struct.pack`` (ints, floats)
    are the fastest packers: ~3x ``array.array`` or numpy, ~7x ``bytes()`` for a 4,096-token item."""
    dtype = DTYPES.get(name, "<f4")
    try:
        if dtype == "|u1":
            # 0/1 each: one byte per entry (msgpack packs it as bin)
            raw: bytes | bytearray = bytearray(values)
        else:
            # "<": little-endian, standard sizes
            raw = struct.pack(f"<{len(values)}{_STRUCT[dtype]}", *values)
    except (OverflowError, TypeError, ValueError, struct.error) as exc:
        raise ValueError(f"SAWItem {name} does not fit {dtype}: {exc}") from exc
    return [dtype, len(values), raw]


def _packable(value: Any) -> bool:
    try:
        _msgpack().packb(value, use_bin_type=True)
    except (TypeError, ValueError):
        return False
    return True


def decode_entry(fields: dict[bytes, bytes], *, run_id: str | bytes) -> DecodedEntry:
    """The item in one stream entry, or BadEntry saying why not."""
    run_b = run_id if isinstance(run_id, bytes) else run_id.encode()
    return DecodedEntry(*_decode(*_named(fields), run_b))


def decode_fields(fields: Sequence[bytes], run_id: bytes) -> tuple[str, int | None, PackedSAWItem]:
    """``decode_entry`` for the entry's fields as XREAD gives them (``[name, value, ...]``), with no dict and no
    ``DecodedEntry`` built: ``(item_id, policy_version, item)``, or BadEntry saying why not."""
    if len(fields) == 6 and fields[0] == b"v" and fields[2] == b"run" and fields[4] == b"data":  # as encoded
        return _decode(fields[1], fields[3], fields[5], run_id)
    return _decode(*_named(dict(zip(fields[0::2], fields[1::2], strict=False))), run_id)


def _named(fields: dict[bytes, bytes]) -> tuple[bytes, bytes, bytes]:
    """``(v, run, data)``; a missing field is ``malformed``."""
    try:
        return fields[b"v"], fields[b"run"], fields[b"data"]
    except KeyError as exc:
        missing = exc.args[0].decode()
        raise BadEntry("malformed", f"no {missing!r} field (fields: {sorted(fields)[:5]})") from None


def _decode(schema: bytes, run: bytes, data: bytes, run_id: bytes) -> tuple[str, int | None, PackedSAWItem]:
    if schema != _SCHEMA:
        raise BadEntry("unknown_schema", f"schema {schema[:20]!r}, this trainer reads {SCHEMA_VERSION}")
    if run != run_id:
        raise BadEntry("foreign", f"entry of run {run[:64]!r}, this run is {run_id.decode()!r}")
    body = _unpack(data)
    item_id, version = body.get("id"), body.get("policy_version")
    if not isinstance(item_id, str) or not (version is None or isinstance(version, int)):
        raise BadEntry("malformed", f"id {item_id!r:.40} / policy_version {version!r:.40}")
    return item_id, version, _item(body)


def _unpack(data: bytes) -> dict[str, Any]:
    msgpack = _msgpack()
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except msgpack.ExtraData as exc:
        raise BadEntry("malformed", f"trailing bytes after the msgpack body ({exc})") from exc
    except ValueError as exc:  # msgpack raises ValueError("Unpack failed: incomplete input") on a cut
        reason = "truncated" if "incomplete" in str(exc) else "malformed"
        raise BadEntry(reason, f"msgpack: {exc}") from exc
    except Exception as exc:  # FormatError, StackError, ...: anything else undecodable
        raise BadEntry("malformed", f"msgpack: {type(exc).__name__}: {exc}") from exc
    if type(body) is not dict:
        raise BadEntry("malformed", f"body is a {type(body).__name__}, expected a map")
    return body


def _raw(tokens: dict[str, Any], name: str) -> bytes:
    """The bytes of ``tokens[name]`` after checking its dtype and that ``length`` entries fill them exactly."""
    entry, dtype = tokens.get(name), DTYPES.get(name, "<f4")
    if not isinstance(entry, list) or len(entry) != 3:
        raise BadEntry(
            "malformed", f"tokens[{name!r}] is {type(entry).__name__}, expected [dtype, length, bytes]"
        )
    got, length, raw = entry
    if got != dtype:
        raise BadEntry("malformed", f"{name} has dtype {got!r:.20}, expected {dtype!r}")
    if type(length) is not int or not isinstance(raw, bytes) or len(raw) != length * _ITEMSIZE[dtype]:
        raise BadEntry(
            "malformed", f"{name}: {len(raw) if isinstance(raw, bytes) else raw!r:.20} bytes for {length!r:.20} "
            f"entries of {dtype}"
        )  # fmt: skip
    return raw


def _item(body: dict[str, Any]) -> PackedSAWItem:
    tokens, weight, meta = body.get("tokens"), body.get("weight"), body.get("meta")
    if type(tokens) is not dict or type(weight) is not float or type(meta) is not dict:
        raise BadEntry("malformed", f"tokens {type(tokens).__name__} / weight {weight!r:.40} / meta {type(meta).__name__}")  # fmt: skip
    arrays = _checked_arrays(tokens)
    ids, attention, action = arrays.get("input_ids"), arrays.get("attention_mask"), arrays.get("action_mask")
    if ids is None or attention is None or action is None:
        for name in ("input_ids", "attention_mask", "action_mask"):
            _raw(tokens, name)  # raises, naming the missing array
    n = len(ids) // 4  # type: ignore[arg-type]
    if n == 0 or len(attention) != n or len(action) != n:  # type: ignore[arg-type]
        raise BadEntry("invalid", f"input_ids has {n} entries, attention_mask {len(attention)}, action_mask {len(action)}")  # type: ignore[arg-type]  # fmt: skip
    n_action = _ones(action)  # type: ignore[arg-type]
    if n_action < 0 or _ones(attention) < 0:  # type: ignore[arg-type]
        raise BadEntry("invalid", "a mask holds values other than 0 and 1")
    if not math.isfinite(weight):
        raise BadEntry("invalid", f"weight must be a finite number, got {weight!r}")
    actor, frozen = None, {}
    for name, raw in arrays.items():
        if name not in _IDS_AND_MASKS:  # a per-action-token float array
            _check_floats(name, raw, n_action)
            if name == "actor_logps":
                actor = PackedTokenLogps.of(raw)
            elif name != "token_weights":
                frozen[name[len(FROZEN_PREFIX) :]] = np.frombuffer(raw, dtype=_NP["<f4"]).tolist()
    return PackedSAWItem.of(arrays, weight=weight, meta=meta, attachments=SampleAttachments(actor, frozen))


def _checked_arrays(tokens: dict[Any, Any]) -> dict[str, bytes]:
    """``{name: bytes}`` of every per-token array, each checked for its dtype and byte count (one combined test
    per array on the fast path; ``_raw`` names what is wrong otherwise)."""
    raws: dict[str, bytes] = {}
    for name, entry in tokens.items():
        spec = _SPEC.get(name)
        if spec is None:
            if not (isinstance(name, str) and name.startswith(FROZEN_PREFIX)):
                unknown = [k for k in tokens if not (isinstance(k, str) and (k in DTYPES or k.startswith(FROZEN_PREFIX)))]  # fmt: skip
                raise BadEntry("malformed", f"unknown per-token arrays {unknown[:5]}")
            spec = _FROZEN_SPEC
        if (
            type(entry) is list and len(entry) == 3 and entry[0] == spec[0] and type(entry[1]) is int
            and type(entry[2]) is bytes and len(entry[2]) == entry[1] * spec[1]
        ):  # fmt: skip
            raws[name] = entry[2]
        else:
            raws[name] = _raw(tokens, name)  # raises BadEntry, naming what is wrong
    return raws


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


def _check_floats(name: str, raw: bytes, n_action: int) -> None:
    """Check a per-action-token float array: one entry per action token, all finite.

    NaN and inf have every exponent bit set, so the top byte of each is 0x7F or 0xFF (sign bit): when no top
    byte is, all are finite (two memchr scans); else numpy looks closer (finite floats with such a top byte
    have |x| >= 2**127 in float32, 2**1023 in float64)."""
    dtype, size = _SPEC.get(name, _FROZEN_SPEC)
    if len(raw) != n_action * size:
        raise BadEntry("invalid", f"{name} has {len(raw) // size} entries, action_mask marks {n_action} action tokens")  # fmt: skip
    top = raw[size - 1 :: size]  # little-endian: the last byte of each holds the sign and high exponent bits
    if (0x7F in top or 0xFF in top) and not np.isfinite(np.frombuffer(raw, dtype=_NP[dtype])).all():
        raise BadEntry("invalid", f"{name} holds NaN or inf")
