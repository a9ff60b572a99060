"""A collective that ran past the process group's timeout, named: which collective, on which rank, which peer.

torch.distributed bounds every collective by the timeout given to ``init_process_group``
(``[timeouts].collective_s``, ``fsdp.init_distributed``); past it gloo raises a ``RuntimeError`` that names
neither the collective nor the rank ("Timed out waiting 2000ms for recv operation to complete"), and each
later collective on the broken group fails at once ("Application timeout caused pair closure").
:func:`named_collective` turns those into ``ludic.timeouts.WaitTimeout`` with the collective, this rank, the
rank waited on where it is known (a broadcast's source; a rank torch's message names) and the time waited.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import torch.distributed as dist

from ludic.timeouts import WaitTimeout

_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_RANK = re.compile(r"\brank[ =:]*(\d+)", re.IGNORECASE)
_bound_s: float | None = None  # the default group's timeout, as init_distributed set it


def set_collective_bound(seconds: float) -> None:
    """Record the default group's timeout (``init_distributed`` calls this) for the errors' ``bound_s``."""
    global _bound_s
    _bound_s = float(seconds)


def is_collective_timeout(exc: BaseException) -> bool:
    """A backend error that says a collective ran out of time (gloo, NCCL's watchdog)."""
    return isinstance(exc, RuntimeError) and bool(_TIMED_OUT.search(str(exc)))


@contextlib.contextmanager
def named_collective(operation: str, *, peer_rank: int | None = None) -> Iterator[None]:
    """Run a collective; its timeout raises ``WaitTimeout`` naming ``operation``, this rank and the peer
    (``peer_rank``, e.g. a broadcast's source; else a rank torch's message names; else the other ranks)."""
    started = time.monotonic()
    try:
        yield
    except RuntimeError as exc:
        if not is_collective_timeout(exc):
            raise
        named = _RANK.search(str(exc))
        if peer_rank is not None:
            peer = f"rank {peer_rank}"
        elif named is not None:
            peer = f"rank {named.group(1)}"
        else:
            world = dist.get_world_size() if dist.is_initialized() else "?"
            peer = f"the other ranks of {world} (torch does not say which)"
        me = dist.get_rank() if dist.is_initialized() else 0
        raise WaitTimeout(
            peer=peer, operation=f"torch.distributed {operation} on rank {me}", waited_s=time.monotonic() - started,
            bound_s=_bound_s, detail=f"torch: {exc}",
        ) from exc  # fmt: skip
