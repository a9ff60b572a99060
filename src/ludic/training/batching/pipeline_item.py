"""SAW items popped from the stream: per-token lists built from the packed arrays on first use.

A stream entry carries its per-token data as little-endian arrays, and the batch source checks them
there (dtypes, lengths, mask values, finite log-probs) with a handful of vectorised calls. Building
the Python lists a ``SAWItem`` holds costs more than everything else in a pop (a 4,096-token item:
~10,000 Python objects), so ``PackedSAWItem`` keeps the checked arrays and builds each list the first
time it is read (collation reads them once per step, on the trainer's side). Apart from that it is
a ``SAWItem``: same fields, assignable; ``dataclasses.replace`` builds (and checks) a copy holding
lists; ``==`` compares by value with any ``SAWItem``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWItem


class _ListFromArray:
    """A data descriptor: the attribute is the list of ``arrays[name]`` (a numpy array, or ``(bytes, dtype)``
    still packed), built on the first read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, f"_list_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        state = obj.__dict__
        if self.slot not in state:
            value = state["_arrays"][self.name]
            if isinstance(value, tuple):
                raw, dtype = value
                value = list(raw) if dtype == "|u1" else np.frombuffer(raw, dtype=dtype)
            state[self.slot] = value if isinstance(value, list) else value.tolist()
        return state[self.slot]

    def __set__(self, obj: Any, value: Any) -> None:  # the dataclass __init__ (replace, copies) sets lists
        obj.__dict__[self.slot] = value


def _same_fields(a: Any, b: Any, cls: type) -> bool:
    return all(getattr(a, f.name) == getattr(b, f.name) for f in dataclasses.fields(cls))


class PackedTokenLogps(ActorTokenLogps):
    """``ActorTokenLogps`` over a checked float32 array; ``token_logps`` is built on first read."""

    token_logps = _ListFromArray()  # type: ignore[assignment]

    @classmethod
    def of(cls, logps: np.ndarray | tuple[bytes, str]) -> PackedTokenLogps:
        obj = cls.__new__(cls)
        obj.__dict__["_arrays"] = {"token_logps": logps}
        return obj

    def __eq__(self, other: object) -> bool:
        return _same_fields(self, other, ActorTokenLogps) if isinstance(other, ActorTokenLogps) else NotImplemented

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
        arrays: dict[str, np.ndarray | tuple[bytes, str]],
        *,
        weight: float,
        meta: dict[str, Any],
        attachments: SampleAttachments,
        token_weights: np.ndarray | tuple[bytes, str] | None = None,
    ) -> PackedSAWItem:
        """From arrays (numpy, or ``(little-endian bytes, dtype)``) already checked as ``SAWItem.__post_init__``
        would check the lists."""
        obj = cls.__new__(cls)
        obj.__dict__.update(_arrays=arrays, weight=weight, meta=meta, attachments=attachments)
        if token_weights is None:
            obj.__dict__["_list_token_weights"] = None
        else:
            arrays["token_weights"] = token_weights
        return obj

    def __eq__(self, other: object) -> bool:
        return _same_fields(self, other, SAWItem) if isinstance(other, SAWItem) else NotImplemented

    __hash__ = None  # type: ignore[assignment]
