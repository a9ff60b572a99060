"""SAW items as Redis stream entries, without pickle.

A compromised queue must not be able to run code in the trainer, so an entry is plain data: three
stream fields, ``v`` (schema version), ``run`` (the run id) and ``data``, a msgpack map whose token
ids, masks and log-probs are little-endian arrays (int32 / uint8 / float32) and whose ``meta`` is
msgpack's own maps, lists, strings and numbers. Decoding checks every field's type and length and
raises ``BadEntry`` with a reason the batch source counts: ``malformed``, ``unknown_schema``,
``foreign``, ``truncated`` or ``invalid``.
"""

from __future__ import annotations

import array
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ludic.distributed.redis_server import REDIS_EXTRA_HINT
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWItem

SCHEMA_VERSION = 1


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
    body = {
        "id": item_id,
        "policy_version": version if isinstance(version, int) else None,
        "input_ids": _le_bytes("i", item.input_ids),
        "attention_mask": bytes(item.attention_mask),  # 0/1 each: one byte per entry
        "action_mask": bytes(item.action_mask),
        "actor_logps": None if actor is None else _le_bytes("f", actor.token_logps),
        "weight": float(item.weight),
        "token_weights": None if item.token_weights is None else _le_bytes("d", item.token_weights),  # float64
        "meta": item.meta,
    }
    try:
        data = _msgpack().packb(body, use_bin_type=True)
    except TypeError as exc:
        bad = [k for k, v in item.meta.items() if not _packable(v)]
        raise TypeError(f"SAWItem.meta keys {bad} hold values msgpack cannot encode ({exc})") from exc
    return {"v": str(SCHEMA_VERSION).encode(), "run": run_id.encode(), "data": data}


def _le_bytes(typecode: str, values: list[Any]) -> bytes:
    """Little-endian int32 ("i") or float32 ("f") bytes; ``array`` packs a list ~1.3x faster than numpy."""
    packed = array.array(typecode, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _packable(value: Any) -> bool:
    try:
        _msgpack().packb(value, use_bin_type=True)
    except (TypeError, ValueError):
        return False
    return True


def decode_entry(fields: dict[bytes, bytes], *, run_id: str) -> DecodedEntry:
    """The item in one stream entry, or BadEntry saying why not."""
    for key in (b"v", b"run", b"data"):
        if key not in fields:
            raise BadEntry("malformed", f"no {key.decode()!r} field (fields: {sorted(fields)[:5]})")
    if fields[b"v"] != str(SCHEMA_VERSION).encode():
        raise BadEntry("unknown_schema", f"schema {fields[b'v'][:20]!r}, this trainer reads {SCHEMA_VERSION}")
    if fields[b"run"] != run_id.encode():
        raise BadEntry("foreign", f"entry of run {fields[b'run'][:64]!r}, this run is {run_id!r}")
    body = _unpack(fields[b"data"])
    item_id, version = body.get("id"), body.get("policy_version")
    if not isinstance(item_id, str) or not (version is None or isinstance(version, int)):
        raise BadEntry("malformed", f"id {item_id!r:.40} / policy_version {version!r:.40}")
    return DecodedEntry(item_id=item_id, policy_version=version, item=_item(body))


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
    if not isinstance(body, dict):
        raise BadEntry("malformed", f"body is a {type(body).__name__}, expected a map")
    return body


def _array(body: dict[str, Any], key: str, dtype: str) -> np.ndarray:
    raw = body.get(key)
    if not isinstance(raw, bytes):
        raise BadEntry("malformed", f"{key} is {type(raw).__name__}, expected bytes")
    size = np.dtype(dtype).itemsize
    if len(raw) % size:
        raise BadEntry("truncated", f"{key} has {len(raw)} bytes, not a multiple of {size}")
    return np.frombuffer(raw, dtype=dtype)


def _checked_logps(logps: np.ndarray) -> ActorTokenLogps:
    """ActorTokenLogps from a float32 array already checked finite (vectorised here: the per-element
    type check in ``ActorTokenLogps.__post_init__`` cost more than the rest of decoding)."""
    if not np.isfinite(logps).all():
        raise BadEntry("invalid", "actor_logps holds NaN or inf")
    actor = object.__new__(ActorTokenLogps)
    actor.token_logps = logps.tolist()  # Python floats, by construction
    return actor


def _item(body: dict[str, Any]) -> SAWItem:
    input_ids = _array(body, "input_ids", "<i4")
    attention_mask = _array(body, "attention_mask", "u1")
    action_mask = _array(body, "action_mask", "u1")
    actor = None if body.get("actor_logps") is None else _checked_logps(_array(body, "actor_logps", "<f4"))
    token_weights = None if body.get("token_weights") is None else _array(body, "token_weights", "<f8")
    if token_weights is not None and not np.isfinite(token_weights).all():
        raise BadEntry("invalid", "token_weights holds NaN or inf")
    weight, meta = body.get("weight"), body.get("meta")
    if not isinstance(weight, float) or not isinstance(meta, dict):
        raise BadEntry("malformed", f"weight {weight!r:.40} / meta {type(meta).__name__}")
    if (attention_mask > 1).any() or (action_mask > 1).any():
        raise BadEntry("invalid", "a mask holds values other than 0 and 1")
    try:
        return SAWItem(
            input_ids=input_ids.tolist(),
            attention_mask=attention_mask.tolist(),
            action_mask=action_mask.tolist(),
            weight=weight,
            meta=meta,
            attachments=SampleAttachments(actor_logps=actor),
            token_weights=None if token_weights is None else token_weights.tolist(),
        )
    except (TypeError, ValueError) as exc:  # lengths disagree, weight not finite, ...
        raise BadEntry("invalid", str(exc)) from exc
