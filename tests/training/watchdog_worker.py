"""A process whose step blocks under the step watchdog (``on_stall="exit"``), for tests/training/test_watchdog.py.

``single``: one process, the step sleeping in ``waiting_for_a_peer``. ``torchrun``: two gloo ranks; rank 1
stalls before the step's barrier, rank 0 waits in it under its watchdog, whose report must name rank 0 and
the collective."""

from __future__ import annotations

import logging
import sys
import time

from ludic.training.watchdog import StepWatchdog


def waiting_for_a_peer() -> None:
    time.sleep(60)


def main(mode: str, bound_s: float) -> None:
    logging.basicConfig(level=logging.INFO)
    if mode == "single":
        StepWatchdog(lambda: 3, bound_s=bound_s, on_stall="exit", poll_s=0.05).start()
        waiting_for_a_peer()
        return
    import torch.distributed as dist

    from ludic.training.parallel.fsdp import init_distributed

    rank, _ = init_distributed("gloo", timeout_s=120.0)
    if rank == 1:
        time.sleep(60)  # the stalled rank: never reaches the barrier
    StepWatchdog(lambda: 0, bound_s=bound_s, on_stall="exit", poll_s=0.05).start()
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
