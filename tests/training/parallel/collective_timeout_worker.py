"""Two gloo ranks where one never arrives, for tests/training/parallel/test_collective_timeout.py.

``barrier``: rank 1 sleeps past the group's 2 s timeout; rank 0's barrier must fail with ``WaitTimeout``.
``broadcast``: rank 0's batch source stalls; rank 1, waiting in ``Rank0BatchSource``'s broadcast, must fail
naming rank 0. The failing rank writes what it caught to ``OUT/rank<R>.json``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

from ludic.timeouts import WaitTimeout
from ludic.training.parallel.batch import Rank0BatchSource
from ludic.training.parallel.collective_timeout import named_collective
from ludic.training.parallel.fsdp import init_distributed

BOUND_S = 2.0
STALL_S = 8.0


class StalledSource:
    async def next_batch(self):
        await asyncio.sleep(STALL_S)
        raise StopAsyncIteration


def main(mode: str, out: Path) -> None:
    rank, _ = init_distributed("gloo", timeout_s=BOUND_S)
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
