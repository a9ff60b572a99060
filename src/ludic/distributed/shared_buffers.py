"""The trainer's side of the shared-memory data plane: the server's buffers, mapped once and reused.

The server hands out one buffer per ``/update_weights`` call (``ludic.inference.weight_sync.shared_memory``), and a
steady run alternates between the same two sets, so mappings are kept by ``(server pid, buffer id)``
and dropped once two publishes in a row did not use them (the server has dropped them too by then).
Before mapping anything of a server pid, it checks that this pid listens on the server's port, and each
buffer is checked to be that server's sealed memfd (``map_peer_buffer``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ludic.inference.weight_sync.shared_memory import check_serves_port, map_peer_buffer


class PeerBuffers:
    """Mappings of one server's shared weight buffers, by ``(pid, buffer id)``."""

    def __init__(self, port: int | None = None) -> None:
        """``port``: where the server listens (the pid a reservation names must hold that socket)."""
        self.port = port
        self._checked: set[int] = set()
        self._maps: dict[tuple[int, int], Tensor] = {}
        self._used: set[tuple[int, int]] = set()
        self._used_before: set[tuple[int, int]] = set()

    def view(self, reservation: dict[str, Any], nbytes: int) -> Tensor:
        """The first ``nbytes`` of the buffer a ``/ludic/reserve_weight_buffer`` reply names, writable."""
        if nbytes < 0:
            raise ValueError(f"a call of {nbytes} bytes: sizes are non-negative")
        pid, buffer_id, fd, file_bytes = _reservation_fields(reservation)
        key = (pid, buffer_id)
        if file_bytes < nbytes:
            raise RuntimeError(f"the server reserved {file_bytes} bytes for a call of {nbytes}")
        mapped = self._maps.get(key)
        if mapped is None or mapped.numel() != file_bytes:
            if self.port is not None and key[0] not in self._checked:
                check_serves_port(key[0], self.port)
                self._checked.add(key[0])
            mapped = self._maps[key] = map_peer_buffer(key[0], fd, file_bytes)
        self._used.add(key)
        return mapped[:nbytes]

    def end_publish(self) -> None:
        """Unmap the buffers neither this publish nor the one before it wrote."""
        keep = self._used | self._used_before
        self._maps = {key: mapped for key, mapped in self._maps.items() if key in keep}
        self._used_before, self._used = self._used, set()

    def __len__(self) -> int:
        return len(self._maps)


def _reservation_fields(reservation: Any) -> tuple[int, int, int, int]:
    """``(pid, buffer, fd, file_bytes)`` of a reservation, each a JSON int; RuntimeError naming a field that is
    not. Read with ``int()``, ``true`` became pid 1, ``2.9`` fd 2, and Infinity raised OverflowError."""
    fields = ("pid", "buffer", "fd", "file_bytes")
    values = [reservation.get(k) for k in fields] if isinstance(reservation, dict) else [None] * len(fields)
    bad = [k for k, v in zip(fields, values, strict=True) if type(v) is not int]
    if bad:
        raise RuntimeError(f"the server's buffer reservation is malformed (int {bad}): {reservation!r:.200}")
    pid, buffer_id, fd, file_bytes = values
    return pid, buffer_id, fd, file_bytes
