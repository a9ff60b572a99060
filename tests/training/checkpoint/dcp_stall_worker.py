"""Two gloo ranks saving (or loading) a DCP checkpoint of an FSDP2 model, for test_dcp_stalled_rank.py.

Both ranks save step 1. Then rank 1 stops itself (SIGSTOP: a host that lost power answers nothing) right
before the ``save`` of step 2 (or the ``load`` of step 1); rank 0 must fail with ``WaitTimeout`` and writes
what it caught to ``rank0.json`` in the output folder, then lets rank 1 go on (SIGCONT) so that both exit."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from ludic.timeouts import WaitTimeout
from ludic.training.config import CheckpointConfig
from ludic.training.parallel.checkpoint import DistributedCheckpointer
from ludic.training.parallel.fsdp import init_distributed

BOUND_S = 2.0


def main(mode: str, out: Path) -> None:
    rank, _ = init_distributed("gloo", timeout_s=BOUND_S)
    pids: list[int] = [0, 0]
    dist.all_gather_object(pids, os.getpid())
    torch.manual_seed(0)
    model = fully_shard(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = DistributedCheckpointer(CheckpointConfig(output_dir=out / "ckpt", every_n_steps=1, max_to_keep=2))
    ckpt.save(model, optimizer, step=1)
    (out / f"saved{rank}").write_text("step 1")
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # rank 0 goes on alone; SIGCONT comes after it failed
    started = time.monotonic()
    try:
        if mode == "save":
            ckpt.save(model, optimizer, step=2)
        else:
            ckpt.load(model, optimizer, fallback=False)
    except WaitTimeout as err:
        record = {"peer": err.peer, "operation": err.operation, "waited_s": err.waited_s, "bound_s": err.bound_s,
                  "message": str(err), "took_s": time.monotonic() - started}  # fmt: skip
        (out / f"rank{rank}.json").write_text(json.dumps(record))
    except Exception as exc:  # rank 1 after SIGCONT: the group is broken by then
        (out / f"rank{rank}.other").write_text(f"{type(exc).__name__}: {exc}")
    if rank == 0:
        os.kill(pids[1], signal.SIGCONT)
    sys.stdout.flush()
    os._exit(0)  # no barrier at exit: the group timed out (see fsdp.exit_distributed for why os._exit)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
