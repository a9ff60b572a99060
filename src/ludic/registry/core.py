"""The generic name -> factory mapping behind every Ludic registry."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class Registry(Generic[T]):
    """A named mapping of factories; unknown names raise ``KeyError`` listing the known ones."""

    def __init__(self, kind: str, plural: str | None = None) -> None:
        self.kind = kind
        self.plural = plural or f"{kind}s"
        self._entries: dict[str, T | str] = {}

    @overload
    def register(self, name: str) -> Callable[[F], F]: ...
    @overload
    def register(self, name: str, obj: T, *, overwrite: bool = False) -> T: ...

    def register(self, name: str, obj: Any = None, *, overwrite: bool = False) -> Any:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator that does."""
        if obj is None:

            def decorator(fn: F) -> F:
                self._add(name, fn, overwrite=overwrite)
                return fn

            return decorator
        self._add(name, obj, overwrite=overwrite)
        return obj

    def register_lazy(self, name: str, target: str, *, overwrite: bool = False) -> None:
        """Register ``"package.module:attr"``, imported on first lookup."""
        if ":" not in target:
            raise ValueError(f"lazy {self.kind} target must look like 'module:attr', got {target!r}")
        self._add(name, target, overwrite=overwrite)

    def _add(self, name: str, obj: Any, *, overwrite: bool) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty str, got {name!r}")
        if name in self._entries and not overwrite:
            raise ValueError(f"{self.kind} {name!r} is already registered; pass overwrite=True to replace it")
        self._entries[name] = obj

    def get(self, name: str) -> T:
        """The factory registered as ``name`` (lazy entries are imported now)."""
        if name not in self._entries:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise KeyError(f"unknown {self.kind} {name!r}; known {self.plural}: {known}")
        entry = self._entries[name]
        if isinstance(entry, str):
            module_name, attr = entry.split(":", 1)
            entry = getattr(importlib.import_module(module_name), attr)
            self._entries[name] = entry
        return entry  # type: ignore[return-value]

    def build(self, name: str, /, **kwargs: Any) -> Any:
        """Look up ``name`` and call it with ``kwargs``."""
        return self.get(name)(**kwargs)  # type: ignore[operator]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
