"""SAW items popped from the stream: per-token lists built from the packed arrays on first use.

A stream entry carries its per-token data as little-endian arrays, and the batch source checks them
there (dtypes, lengths, mask values, finite log-probs) with a handful of vectorised calls. Building
the Python lists a ``SAWItem`` holds costs more than everything else in a pop (a 4,096-token item:
~10,000 Python objects), so ``PackedSAWItem`` keeps the checked arrays and builds each list the first
time it is read (collation reads them once per step, on the trainer's side). Apart from that it is
a ``SAWItem``: same fields, assignable; ``dataclasses.replace`` builds (and checks) a copy holding
lists; ``==`` compares by value with any ``SAWItem``.

The trainer's path never builds the lists: it reads the arrays through ``token_arrays`` (``packed``),
copies with a new meta (``with_meta``) and takes packing views (``view_from``) with the arrays still
packed, so collation turns them into tensors directly. A list assigned to a field (or once built)
is what every reader sees from then on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWItem

_new = object.__new__  # no __init__: the fields are set from checked arrays


ARRAY_DTYPES = {
    "input_ids": "<i4", "attention_mask": "|u1", "action_mask": "|u1", "token_weights": "<f8", "token_logps": "<f4",
}  # fmt: skip
"""The dtype of the little-endian bytes each field is kept in until read (the stream's wire dtypes)."""


class _ListFromArray:
    """A data descriptor: the attribute is the list of ``arrays[name]`` (bytes still packed, or a numpy array),
    built on the first read; None where ``arrays`` has no ``name`` (an item without token weights)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot, self.dtype = name, f"_list_{name}", ARRAY_DTYPES[name]

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        state = obj.__dict__
        if self.slot not in state:
            value = state["_arrays"].get(self.name)
            if type(value) is bytes:
                value = list(value) if self.dtype == "|u1" else np.frombuffer(value, dtype=self.dtype)
            state[self.slot] = value if value is None or isinstance(value, list) else value.tolist()
        return state[self.slot]

    def __set__(self, obj: Any, value: Any) -> None:  # the dataclass __init__ (replace, copies) sets lists
        obj.__dict__[self.slot] = value


_SLOTS = {name: f"_list_{name}" for name in ARRAY_DTYPES}


def _packed(obj: Any, name: str) -> np.ndarray | None:
    """The numpy array behind field ``name``, unless its list was built or assigned (then None: read the list)."""
    state, slot = obj.__dict__, _SLOTS.get(name)
    if slot is None or slot in state:  # not a per-token field, or its list is what to read
        return None
    value = state["_arrays"].get(name)
    if type(value) is bytes:
        state["_arrays"][name] = value = np.frombuffer(value, dtype=ARRAY_DTYPES[name])
    return value if type(value) is np.ndarray else None


def wire_arrays(items: list[Any], name: str) -> list[bytes | None] | None:
    """For each item, the bytes behind field ``name`` as they came off the wire (None where the item has no such
    field), for checks of a whole read in one call; None when that is not what every item holds (an item that
    is not a ``PackedSAWItem``, a list built or assigned, an array read as numpy): then read the fields."""
    slot, out = _SLOTS[name], []
    for item in items:
        if type(item) is not PackedSAWItem or slot in item.__dict__:
            return None
        value = item.__dict__["_arrays"].get(name)
        if value is not None and type(value) is not bytes:
            return None
        out.append(value)
    return out


def _same_fields(a: Any, b: Any, cls: type) -> bool:
    return all(getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(cls))


class PackedTokenLogps(ActorTokenLogps):
    """``ActorTokenLogps`` over a checked float32 array; ``token_logps`` is built on first read."""

    token_logps = _ListFromArray()  # type: ignore[assignment]

    @classmethod
    def of(cls, logps: bytes | np.ndarray) -> PackedTokenLogps:
        """From float32 log-probs (little-endian bytes or a numpy array) already checked."""
        obj = _new(cls)
        obj.__dict__["_arrays"] = {"token_logps": logps}
        return obj

    def packed(self, name: str) -> np.ndarray | None:
        return _packed(self, name)

    def __eq__(self, other: object) -> bool:
        return (
            _same_fields(self, other, ActorTokenLogps)
            if isinstance(other, ActorTokenLogps)
            else NotImplemented
        )

    __hash__ = None  # type: ignore[assignment]


class PackedSAWItem(SAWItem):
    """A ``SAWItem`` whose per-token lists (``input_ids``, the masks, ``token_weights``) are built on first read."""

    input_ids = _ListFromArray()  # type: ignore[assignment]
    attention_mask = _ListFromArray()  # type: ignore[assignment]
    action_mask = _ListFromArray()  # type: ignore[assignment]
    token_weights = _ListFromArray()  # type: ignore[assignment]

    @classmethod
    def of(
        cls,
        arrays: dict[str, bytes | np.ndarray],
        *,
        weight: float,
        meta: dict[str, Any],
        attachments: SampleAttachments,
    ) -> PackedSAWItem:
        """From per-token arrays already checked as ``SAWItem.__post_init__`` would check the lists: ``arrays`` maps
        ``input_ids``, the masks and (optionally) ``token_weights`` to little-endian bytes of their
        ``ARRAY_DTYPES`` or numpy arrays (other keys are ignored)."""
        obj = _new(cls)
        obj.__dict__ = {"_arrays": arrays, "weight": weight, "meta": meta, "attachments": attachments}
        return obj

    def packed(self, name: str) -> np.ndarray | None:
        """The checked array behind ``name`` (no list built), or None where the list is what to read."""
        return _packed(self, name)

    @property
    def num_tokens(self) -> int:
        array = self.packed("input_ids")
        return len(self.input_ids) if array is None else len(array)

    @property
    def num_action_tokens(self) -> int:
        array = self.packed("action_mask")
        return int(sum(self.action_mask)) if array is None else int(np.count_nonzero(array))

    def with_meta(self, meta: dict[str, Any]) -> PackedSAWItem:
        """A copy with ``meta`` replaced, sharing the (read-only) arrays and any lists already built."""
        obj = type(self).__new__(type(self))
        obj.__dict__.update(self.__dict__, meta=meta, _arrays=dict(self.__dict__["_arrays"]))
        return obj

    def view_from(self, start: int) -> PackedSAWItem:
        """The item without its first ``start`` tokens (action tokens must all come after ``start``)."""
        obj = self.with_meta(self.meta)
        state = obj.__dict__
        for name in ("input_ids", "attention_mask", "action_mask"):
            array = self.packed(name)
            state.pop(f"_list_{name}", None)
            state["_arrays"][name] = getattr(self, name)[start:] if array is None else array[start:]
        return obj

    def __eq__(self, other: object) -> bool:
        return _same_fields(self, other, SAWItem) if isinstance(other, SAWItem) else NotImplemented

    __hash__ = None  # type: ignore[assignment]
