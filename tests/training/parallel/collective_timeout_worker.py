"""Two gloo ranks where one never arrives, for tests/training/parallel/test_collective_timeout.py.

``barrier``: rank 1 sleeps past the group's 2 s timeout; rank 0's barrier must fail with ``WaitTimeout``.
``broadcast``: rank 0's batch source stalls; rank 1, waiting in ``Rank0BatchSource``'s broadcast, must fail
naming rank 0. The failing rank writes what it caught to ``OUT/rank<R>.json``.
``peer_killed`` (one torchrun per rank, as on two hosts): both ranks loop over a step's collectives (rank 0's
batch broadcast, the loss all-reduce) until the test SIGKILLs rank 1 (its pid in ``OUT/pid1``, written once
both ranks are in the loop); rank 0 prints the traceback and exits 1, as ``ludic train`` under torchrun does.
``norm_peer_killed`` (one torchrun per rank): rank 1 SIGKILLs itself once both hold sharded (DTensor)
gradients; rank 0 then takes the global gradient norm and writes what it caught to ``OUT/rank<R>.json``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ludic.timeouts import WaitTimeout
from ludic.training.parallel.batch import Rank0BatchSource
from ludic.training.parallel.collective_timeout import named_collective
from ludic.training.parallel.fsdp import init_distributed
from ludic.training.parallel.step import DataParallelGroup
from ludic.training.types import SAWBatch, SAWItem

BOUND_S = 2.0
STALL_S = 8.0


class StalledSource:
    async def next_batch(self):
        await asyncio.sleep(STALL_S)
        raise StopAsyncIteration


class CountingSource:
    """One one-item batch per call, after a short wait (rank 0 reading its stream)."""

    async def next_batch(self) -> SAWBatch:
        await asyncio.sleep(0.02)
        item = SAWItem(input_ids=[1, 2, 3], attention_mask=[1, 1, 1], action_mask=[0, 1, 1], weight=1.0, meta={})
        return SAWBatch(items=[item], meta={})


def steps_until_killed(rank: int, out: Path) -> None:
    import traceback

    source, group = Rank0BatchSource(CountingSource), DataParallelGroup(active=True)
    try:
        for step in range(100_000):
            asyncio.run(source.next_batch())
            group.sum(torch.ones(8))
            if step == 20:
                (out / f"pid{rank}").write_text(str(os.getpid()))
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


def norm_after_peer_killed(rank: int, out: Path) -> None:
    """The gradient norm's all-reduce runs inside ``get_total_norm`` (DTensor's reduction), not only in
    ``full_tensor()``: a peer lost there must still be named."""
    import signal

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    grads = [distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)]) for _ in range(3)]
    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)  # rank 1's kernel has closed its sockets
    try:
        DataParallelGroup(active=True).total_norm(grads)
        record = {"type": "none"}
    except Exception as exc:
        record = {"type": type(exc).__name__, "message": str(exc)}
    (out / "rank0.part").write_text(json.dumps(record))
    (out / "rank0.part").rename(out / "rank0.json")  # whole when the test sees it
    os._exit(0)


def main(mode: str, out: Path) -> None:
    rank, _ = init_distributed("gloo", timeout_s=60.0 if mode.endswith("peer_killed") else BOUND_S)
    if mode == "peer_killed":
        steps_until_killed(rank, out)
    if mode == "norm_peer_killed":
        norm_after_peer_killed(rank, out)
    started = time.monotonic()
    try:
        if mode == "barrier":
            if rank == 1:
                time.sleep(STALL_S)
                os._exit(0)
            with named_collective("barrier"):
                dist.barrier()
        else:
            asyncio.run(Rank0BatchSource(StalledSource).next_batch())
    except WaitTimeout as err:
        record = {"peer": err.peer, "operation": err.operation, "waited_s": err.waited_s, "bound_s": err.bound_s,
                  "message": str(err), "took_s": time.monotonic() - started}  # fmt: skip
        (out / f"rank{rank}.json").write_text(json.dumps(record))
    except Exception as exc:  # rank 0 of "broadcast" after its stall: the group is broken by then
        (out / f"rank{rank}.other").write_text(f"{type(exc).__name__}: {exc}")
    sys.stdout.flush()
    os._exit(0)  # no barrier at exit: the group timed out (see fsdp.exit_distributed for why os._exit)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
