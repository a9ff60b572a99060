"""A rank that stops answering (its host died) right before a DCP checkpoint save or load fails the other
rank within ``[timeouts].collective_s`` with ``WaitTimeout`` naming the operation ("DCP save of step 2"),
this rank and the time waited. Before, gloo's own error named neither the save nor any rank."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from ludic.testing import torchrun_argv

WORKER = Path(__file__).with_name("dcp_stall_worker.py")
BOUND_S = 2.0


def _run(mode: str, out: Path) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = torchrun_argv(out / "torchrun", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                        f"--master_port={port}", str(WORKER), mode, str(out))  # fmt: skip
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert (out / "saved0").is_file() and (out / "saved1").is_file()  # step 1 saved by both: the save works
    return json.loads((out / "rank0.json").read_text())


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("mode", "operation"), [("save", "DCP save of step 2"), ("load", "DCP load of step_000001")])
def test_a_rank_that_stops_before_a_checkpoint_fails_the_other_within_the_bound_naming_it(
    tmp_path, mode, operation
) -> None:
    got = _run(mode, tmp_path)
    assert got["operation"] == f"torch.distributed {operation} on rank 0"
    assert got["peer"] == "rank 1 (the only other rank)"  # gloo names no rank; of 2 ranks it can only be rank 1
    assert got["bound_s"] == BOUND_S and BOUND_S - 0.1 <= got["waited_s"] <= BOUND_S + 3.0
    assert got["took_s"] <= BOUND_S + 3.0
    assert operation in got["message"] and "after" in got["message"]
    if mode == "save":  # the half-written step 2 never became the latest checkpoint
        assert json.loads((tmp_path / "ckpt" / "latest.json").read_text())["step"] == 1
