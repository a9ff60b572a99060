"""A collective whose peer rank never arrives fails within ``[timeouts].collective_s`` (``init_distributed``'s
timeout), with ``WaitTimeout`` naming the collective, this rank, the rank waited on where it is known and the
time waited. Before, gloo's error named neither the collective nor any rank."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.training.parallel.collective_timeout import is_collective_timeout

WORKER = Path(__file__).with_name("collective_timeout_worker.py")
BOUND_S = 2.0


def _run(mode: str, out: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={port}", str(WORKER), mode, str(out)]  # fmt: skip
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


@pytest.mark.timeout(120)
def test_a_barrier_whose_peer_never_arrives_fails_within_the_bound_naming_the_collective(tmp_path) -> None:
    _run("barrier", tmp_path)
    got = json.loads((tmp_path / "rank0.json").read_text())
    assert got["operation"] == "torch.distributed barrier on rank 0"
    assert got["peer"] == "the other ranks of 2 (torch does not say which)"  # gloo names no rank
    assert got["bound_s"] == BOUND_S and BOUND_S - 0.1 <= got["waited_s"] <= BOUND_S + 1.5
    assert got["took_s"] <= BOUND_S + 1.5
    assert "Timed out" in got["message"] and "after" in got["message"]


@pytest.mark.timeout(120)
def test_ranks_waiting_for_rank_0s_batch_fail_naming_rank_0(tmp_path) -> None:
    _run("broadcast", tmp_path)
    got = json.loads((tmp_path / "rank1.json").read_text())
    assert got["peer"] == "rank 0"
    assert got["operation"] == "torch.distributed broadcast of the step's batch on rank 1"
    assert BOUND_S - 0.1 <= got["waited_s"] <= BOUND_S + 1.5


def test_only_timeouts_are_recognised() -> None:
    assert is_collective_timeout(RuntimeError("[gloo/unbound_buffer.cc:78] Timed out waiting 2000ms for recv"))
    assert is_collective_timeout(RuntimeError("Application timeout caused pair closure"))
    assert not is_collective_timeout(RuntimeError("Connection reset by peer"))
    assert not is_collective_timeout(ValueError("timed out"))
