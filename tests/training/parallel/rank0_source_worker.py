"""``torchrun --nproc_per_node=2 rank0_source_worker.py OUT``: drives ``Rank0BatchSource`` through a
batch, a failure on rank 0, an end of data, and a batch that cannot cross ranks, then trains one step
with a Trainer whose rank-0 source raises. Each rank writes what it saw to ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, Qwen2Config

from ludic.training.algorithm import RLAlgorithm
from ludic.training.config import TrainerConfig
from ludic.training.credit.assigners import EpisodicReturn
from ludic.training.loss import ReinforceLoss
from ludic.training.parallel.batch import Rank0BatchSource
from ludic.training.parallel.fsdp import exit_distributed
from ludic.training.trainer import Trainer
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWBatch, SAWItem

faulthandler.enable()  # a rank that aborts (SIGABRT from C++) prints every thread's Python stack first


def sample_item() -> SAWItem:
    return SAWItem(
        input_ids=[5, 6, 7, 8], attention_mask=[1, 1, 1, 1], action_mask=[0, 0, 1, 1], weight=-0.25,
        meta={"rollout_id": "r0", "nested": {"turn": [1, 2]}},
        attachments=SampleAttachments(ActorTokenLogps([-0.5, -1.5]), frozen_logps={"ref_logps": [-0.7, -1.1]}),
    )  # fmt: skip


class ScriptedSource:
    """Rank 0's source: plays ``script`` (a batch, or an exception to raise), one entry per call."""

    def __init__(self, script: list) -> None:
        self.script = list(script)

    async def next_batch(self) -> SAWBatch:
        entry = self.script.pop(0)
        if isinstance(entry, BaseException):
            raise entry
        return entry


def outcome(source: Rank0BatchSource) -> dict:
    """What one ``next_batch`` call gave this rank: the batch as JSON, or the exception's type and text."""
    try:
        batch = asyncio.run(source.next_batch())
    except BaseException as exc:  # recording the outcome is the point
        return {"raised": type(exc).__name__, "message": str(exc)}
    item = batch.items[0]
    return {"meta": batch.meta, "input_ids": item.input_ids, "action_mask": item.action_mask,
            "weight": item.weight, "item_meta": item.meta, "actor": item.attachments.actor_logps.token_logps,
            "frozen": item.attachments.frozen_logps}  # fmt: skip


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    built: list[int] = []

    def factory() -> ScriptedSource:
        built.append(rank)
        return ScriptedSource([
            SAWBatch(items=[sample_item()], meta={"target_rollouts": 1}),
            ValueError("reward server unreachable"),
            SAWBatch(items=[sample_item()], meta={"not_json": object()}),
            StopAsyncIteration(),
        ])  # fmt: skip

    source = Rank0BatchSource(factory)
    seen = [outcome(source) for _ in range(4)]
    seen.append(train_with_failing_source())
    dist.barrier()  # both ranks are still in step: every failure above reached every rank
    (out / f"rank{rank}.json").write_text(json.dumps({"seen": seen, "factory_calls": len(built)}))
    exit_distributed()


def train_with_failing_source() -> dict:
    """A Trainer step whose rank-0 source raises: every rank's step raises, none waits forever."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=64, pad_token_id=0)  # fmt: skip
    algo = RLAlgorithm(name="reinforce", credit_assigner=EpisodicReturn(), loss=ReinforceLoss())
    source = Rank0BatchSource(lambda: ScriptedSource([RuntimeError("actor pool exhausted")]))
    trainer = Trainer(model=AutoModelForCausalLM.from_config(config), algo=algo, batch_source=source,
                      cfg=TrainerConfig(lr=1e-3, pad_token_id=0))  # fmt: skip
    try:
        trainer.train_step_sync()
    except BaseException as exc:
        return {"raised": type(exc).__name__, "message": str(exc), "step": trainer.step}
    finally:
        trainer.close()
    return {"raised": None, "step": trainer.step}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
