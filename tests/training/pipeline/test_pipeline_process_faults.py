"""Faults with real processes: a trainer SIGKILLed and resumed, an actor killed mid-batch.

The processes are the example's own scripts (examples/pipeline_rl/run_trainer.py, run_actor.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from ludic.testing import tiny_model_path
from ludic.training import Trainer, TrainerConfig, make_grpo
from ludic.training.pipeline import PipelineBatchSource, PipelineStream, encode_item

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pipeline_rl"
pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _wait_for(cond, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} while waiting for {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


async def _push(url: str, run_id: str, make_item, numbers) -> None:
    stream = PipelineStream(url, run_id)
    await stream.push([encode_item(make_item(n), run_id=run_id, item_id=f"item-{n}") for n in numbers])
    await stream.close()


def _ledger(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_trainer_sigkilled_and_resumed_trains_every_item_exactly_once(
    redis_server, run_id, make_item, tmp_path
):
    out, ledger = tmp_path / "run", tmp_path / "trained.jsonl"
    cmd = [sys.executable, str(EXAMPLE / "run_trainer.py"), "--redis-url", redis_server.url,
           "--run-id", run_id, "--model-dir", str(tiny_model_path()), "--output-dir", str(out),
           "--steps", "8", "--batch-size", "8", "--group-size", "4", "--max-staleness", "100",
           "--checkpoint-every", "3", "--trained-log", str(ledger)]  # fmt: skip
    await _push(redis_server.url, run_id, make_item, range(40))  # enough for 5 steps of 8
    first = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:  # step 6 waits for items that are not there yet: kill it there, 2 steps after its checkpoint
        _wait_for(lambda: len(_ledger(ledger)) >= 5 and (out / "step_000003").is_dir(), 120, "5 steps", first)
        time.sleep(1.0)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    lost = _ledger(ledger)
    assert [line["step"] for line in lost] == [1, 2, 3, 4, 5]
    await _push(redis_server.url, run_id, make_item, range(40, 64))
    second = subprocess.run([*cmd, "--resume"], env=_env(), capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resumed at step 3" in second.stdout
    resumed = _ledger(ledger)[len(lost):]
    assert [line["step"] for line in resumed] == [4, 5, 6, 7, 8]
    # The final model's lineage: steps 1-3 of the first run (in its checkpoint), then the second run.
    trained = [i for line in lost[:3] + resumed for i in line["ids"]]
    assert trained == [f"item-{n}" for n in range(64)]  # each item once, none skipped, in order
    assert lost[3]["ids"] == resumed[0]["ids"]  # the work lost with the crash was redone, not skipped


def test_actor_killed_mid_batch_leaves_whole_groups_and_training_goes_on(redis_server, run_id, tmp_path):
    base = [sys.executable, str(EXAMPLE / "run_actor.py"), "--redis-url", redis_server.url, "--run-id", run_id,
            "--model-dir", str(tiny_model_path()), "--trainer-batch-size", "8", "--prompts", "2",
            "--group-size", "4", "--max-staleness", "3"]  # fmt: skip
    victim = subprocess.Popen([*base, "--seed", "1"], env=_env())
    survivor = subprocess.Popen([*base, "--seed", "2"], env=_env())
    stream_len = _stream_len(redis_server.url, run_id)
    try:
        _wait_for(lambda: stream_len() >= 8, 120, "a first batch", victim)
        victim.send_signal(signal.SIGKILL)  # most likely mid-generation of its next batch
        victim.wait()
        source = _Recording(PipelineBatchSource(redis_url=redis_server.url, run_id=run_id, batch_size=8,
                                                vocab_size=1000, max_staleness=100))
        trainer = Trainer(
            model=AutoModelForCausalLM.from_pretrained(tiny_model_path()),
            algo=make_grpo(group_size=4),
            batch_source=source,
            cfg=TrainerConfig(lr=1e-4, max_seq_len=64, micro_token_budget=2048, pad_token_id=0,
                              sync_every_steps=0),
        )  # fmt: skip
        trainer.train_sync(6)  # far more than the victim pushed: the survivor alone feeds these steps
        assert trainer.step == 6
        seen: dict[tuple, int] = {}
        for it in source.items:
            key = (it.meta["request_meta"]["actor_seed"], it.meta["request_meta"]["group_id"])
            seen[key] = seen.get(key, 0) + 1
        assert survivor.poll() is None
        assert all(count == 4 for count in seen.values()), seen  # no half-pushed GRPO group
        assert {actor for actor, _ in seen} >= {2}
        trainer.close()  # cancels the source's read-ahead on the trainer's loop
    finally:
        for proc in (victim, survivor):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)


def _stream_len(url: str, run_id: str):
    import redis

    client = redis.Redis.from_url(url)
    key = PipelineStream(url, run_id).items_key
    return lambda: int(client.xlen(key))


class _Recording:
    def __init__(self, inner: PipelineBatchSource) -> None:
        self.inner, self.items = inner, []

    async def next_batch(self):
        batch = await self.inner.next_batch()
        self.items.extend(batch.items)
        return batch


def test_run_local_trains_with_two_actor_processes_and_a_weight_server(tmp_path):
    """The example end to end: Redis, `python -m ludic.inference.server`, 2 actors, the trainer; the tiny
    model and Redis directories it made in the temporary folder are gone after."""
    out, scratch = tmp_path / "run", tmp_path / "tmp"
    scratch.mkdir()
    result = subprocess.run(
        [sys.executable, str(EXAMPLE / "run_local.py"), "--actors", "2", "--steps", "4",
         "--prompts", "1", "--group-size", "4", "--output-dir", str(out)],
        env={**_env(), "TMPDIR": str(scratch)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert sorted(p.name for p in scratch.glob("ludic-*")) == []
    steps = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [s.split(":")[0] for s in steps] == ["step 1", "step 2", "step 3", "step 4"]
    assert all(float(s.rsplit("staleness ", 1)[1].split()[0]) <= 1.0 for s in steps)  # "staleness 0.00 0.1 s"
    state = json.loads((out / "step_000004" / "trainer_state.json").read_text())
    assert state["metadata"]["batch_source"]["consumed"] >= 16
