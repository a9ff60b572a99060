"""A collective that failed, named: which collective, on which rank, which peer, and what to do now.

torch.distributed's backends fail a collective with a ``RuntimeError`` that names neither the collective nor
the rank. Two failures matter on the training path:

- past the process group's timeout (``[timeouts].collective_s``, ``fsdp.init_distributed``) gloo raises
  "Timed out waiting 2000ms for recv operation to complete", then "Application timeout caused pair closure"
  on each later collective: :func:`named_collective` raises ``ludic.timeouts.WaitTimeout``;
- a peer process that died while its host lives on (SIGKILL, OOM kill, a crash) has its sockets closed by
  its kernel, so gloo raises at once "Connection closed by peer [ADDR]:PORT" or "Read error [ADDR]:PORT:
  Connection reset by peer" (NCCL: "remote process exited or there was a network error"):
  :func:`named_collective` raises :class:`PeerLost`, which also says what to do (resume from the last
  checkpoint on the hosts that remain). A host that loses power sends no reset: that is the timeout above.

Both carry the collective (the outermost ``named_collective`` around it: the purpose, e.g. "DCP save of step
4", rather than the primitive inside it; a ``catch_all`` one, such as the Trainer's whole step, only when no
other is open, so a collective nobody named still fails named by its step), this rank, the peer where it is known (a broadcast's source; the
other rank of two; a rank torch's message names; else the address gloo names) and the time spent in it, with
torch's error chained.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import time
from collections.abc import Iterator

import torch.distributed as dist

from ludic.timeouts import WaitTimeout

_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_PEER_GONE = re.compile(
    r"connection (?:closed|reset) by peer|broken pipe|connection refused|remote process exited|ncclRemoteError",
    re.IGNORECASE,
)
_BACKEND = re.compile(r"gloo|nccl|c10d|ProcessGroup|collective operation", re.IGNORECASE)  # torch's backends say so
_RANK = re.compile(r"\brank[ =:]*(\d+)", re.IGNORECASE)
_ADDRESS = re.compile(r"\[([0-9A-Za-z.:%-]+)\]:\d+")  # gloo's "[10.0.0.2]:41234"
_bound_s: float | None = None  # the default group's timeout, as init_distributed set it
_open: contextvars.ContextVar[tuple[tuple[str, int | None, bool], ...]] = contextvars.ContextVar(
    "ludic_named_collectives", default=()
)  # (operation, peer_rank, catch_all) of each open named_collective, outermost first
RESUME_HINT = (
    "the run cannot go on with a rank missing: stop every rank (torchrun does once this one exits) and "
    "resume from the last checkpoint, on the hosts that remain with a smaller --nnodes if that host is gone "
    "(docs/cluster.md, 'Resuming on fewer hosts')"
)


class PeerLost(RuntimeError):
    """A collective's peer rank went away mid-run: ``peer`` (who), ``operation`` (which collective, on which
    rank), ``waited_s`` (time spent in it), ``detail`` (torch's own message). A ``RuntimeError``, as torch's
    error it replaces, so handlers written for that still catch it."""

    def __init__(self, *, peer: str, operation: str, waited_s: float, detail: str = "") -> None:
        self.peer, self.operation, self.waited_s, self.detail = peer, operation, waited_s, detail
        message = (
            f"{operation}: lost {peer} after {waited_s:.1f} s (its connection closed: the process died); "
        )
        super().__init__(message + RESUME_HINT + (f"; {detail}" if detail else ""))

    def __reduce__(self):  # picklable with its keywords, as WaitTimeout
        return _rebuild, (self.peer, self.operation, self.waited_s, self.detail)


def _rebuild(peer: str, operation: str, waited_s: float, detail: str) -> PeerLost:
    return PeerLost(peer=peer, operation=operation, waited_s=waited_s, detail=detail)


def set_collective_bound(seconds: float) -> None:
    """Record the default group's timeout (``init_distributed`` calls this) for the errors' ``bound_s``."""
    global _bound_s
    _bound_s = float(seconds)


def is_collective_timeout(exc: BaseException) -> bool:
    """A backend error that says a collective ran out of time (gloo, NCCL's watchdog)."""
    return isinstance(exc, RuntimeError) and bool(_TIMED_OUT.search(str(exc)))


def is_peer_loss(exc: BaseException) -> bool:
    """A backend error that says a peer's connection closed or reset (its process died), not a timeout."""
    return (
        isinstance(exc, RuntimeError) and not isinstance(exc, PeerLost) and not is_collective_timeout(exc)
        and bool(_PEER_GONE.search(str(exc)))
    )  # fmt: skip


def _named_rank(text: str, me: int) -> str | None:
    """A rank torch's message names, other than this one (NCCL's "[Rank 0] ..." is the rank reporting)."""
    return next((m.group(1) for m in _RANK.finditer(text) if int(m.group(1)) != me), None)


def _peer(exc: BaseException, peer_rank: int | None, me: int, world: int | None) -> str:
    """Who a failed collective was waiting on or lost, from the most to the least certain: the rank given,
    a rank torch's message names, the other rank of two, the address gloo names, else all the others."""
    text = str(exc)
    address = _ADDRESS.search(text)
    at = f" at {address.group(1)}" if address is not None else ""
    rank = peer_rank if peer_rank is not None else _named_rank(text, me)
    if rank is not None:
        return f"rank {rank}{at}"
    if world == 2:
        return f"rank {1 - me}{at or ' (the only other rank)'}"
    if address is not None:
        return f"the rank(s) at {address.group(1)} (gloo names the address, not the rank)"
    return f"the other ranks of {world if world is not None else '?'} (torch does not say which)"


@contextlib.contextmanager
def named_collective(operation: str, *, peer_rank: int | None = None, catch_all: bool = False) -> Iterator[None]:
    """Run a collective; its timeout raises ``WaitTimeout``, its peer's death :class:`PeerLost`, each naming
    the outermost open ``operation``, this rank and the peer (the innermost ``peer_rank`` given, e.g. a
    broadcast's source; else see the module docstring). Nested uses name the failure once, from the inside.
    ``catch_all``: a scope around many collectives (a whole training step), whose name is used only when no
    other ``named_collective`` is open, for a collective that none names; it translates only errors whose
    message names a torch.distributed backend (gloo's source path, NCCL), as the step does other I/O too."""
    frames = _open.get()
    token = _open.set((*frames, (operation, peer_rank, catch_all)))
    started = time.monotonic()
    try:
        yield
    except RuntimeError as exc:
        lost = is_peer_loss(exc)
        if isinstance(exc, PeerLost) or not (lost or is_collective_timeout(exc)):
            raise  # not the backend's, or already named by an inner named_collective
        if catch_all and not _BACKEND.search(str(exc)):
            raise  # e.g. a judge's "timed out" inside the step: not a collective
        stack = (*frames, (operation, peer_rank, catch_all))
        named = [f for f in stack if not f[2]] or list(stack)
        known = [r for _, r, _ in stack if r is not None]
        me = dist.get_rank() if dist.is_initialized() else 0
        world = dist.get_world_size() if dist.is_initialized() else None
        what = f"torch.distributed {named[0][0]} on rank {me}"
        waited = time.monotonic() - started
        peer = _peer(exc, known[-1] if known else None, me, world)
        if lost:
            raise PeerLost(peer=peer, operation=what, waited_s=waited, detail=f"torch: {exc}") from exc
        raise WaitTimeout(peer=peer, operation=what, waited_s=waited, bound_s=_bound_s,
                          detail=f"torch: {exc}") from exc  # fmt: skip
    finally:
        _open.reset(token)
