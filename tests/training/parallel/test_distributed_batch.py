"""``Rank0BatchSource`` across two real gloo ranks (``torchrun``): what rank 0's source produces, raises
or runs out of reaches every rank, and a failure never leaves a rank waiting."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from ludic.testing import torchrun_argv
from ludic.training.parallel.batch import item_from_json, item_to_json
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWItem

WORKER = Path(__file__).with_name("rank0_source_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("rank0_source")
    cmd = torchrun_argv(out / "torchrun", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                        f"--master_port={free_port()}", str(WORKER), str(out))  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_every_rank_receives_rank0s_batch_whole_and_only_rank0_builds_a_source(seen):
    rank0, rank1 = seen
    assert rank0["factory_calls"] == 1 and rank1["factory_calls"] == 0
    first = rank1["seen"][0]
    assert first == rank0["seen"][0]
    assert first["input_ids"] == [5, 6, 7, 8] and first["weight"] == -0.25
    assert first["item_meta"] == {"rollout_id": "r0", "nested": {"turn": [1, 2]}}
    assert first["actor"] == [-0.5, -1.5] and first["frozen"] == {"ref_logps": [-0.7, -1.1]}


def test_a_failure_on_rank0_fails_every_rank_with_its_reason(seen):
    rank0, rank1 = (s["seen"][1] for s in seen)
    assert rank0 == {"raised": "ValueError", "message": "reward server unreachable"}
    assert rank1["raised"] == "RuntimeError"
    assert rank1["message"] == "rank 0's batch source failed: ValueError: reward server unreachable"


def test_a_batch_that_cannot_cross_ranks_is_refused_on_every_rank(seen):
    rank0, rank1 = (s["seen"][2] for s in seen)
    assert rank0["raised"] == "TypeError" and "JSON-serialisable" in rank0["message"]
    assert rank1["raised"] == "RuntimeError" and "JSON-serialisable" in rank1["message"]


def test_the_end_of_rank0s_data_ends_every_rank(seen):
    assert [s["seen"][3]["raised"] for s in seen] == ["StopAsyncIteration", "StopAsyncIteration"]


def test_a_trainer_step_fails_on_every_rank_without_advancing(seen):
    rank0, rank1 = (s["seen"][4] for s in seen)
    assert rank0["raised"] == "RuntimeError" and rank0["message"] == "actor pool exhausted"
    assert rank1["raised"] == "RuntimeError" and "actor pool exhausted" in rank1["message"]
    assert rank0["step"] == rank1["step"] == 0


def test_json_round_trip_keeps_every_field():
    item = SAWItem(input_ids=[1, 2, 3], attention_mask=[1, 1, 1], action_mask=[0, 1, 1], weight=0.5,
                   meta={"k": "v"}, attachments=SampleAttachments(ActorTokenLogps([-1.0, -2.0]),
                                                                  frozen_logps={"teacher_logps": [-0.1, -0.2]}),
                   token_weights=[0.5, -1.0])  # fmt: skip
    assert item_from_json(json.loads(json.dumps(item_to_json(item)))) == item
