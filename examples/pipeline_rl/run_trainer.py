"""Pipeline RL trainer: pop SAW batches from the run's Redis stream, train, publish weights.

    python examples/pipeline_rl/run_trainer.py --redis-url redis://:TOKEN@127.0.0.1:6379/0 \
        --run-id demo --model-dir MODEL_DIR --server-url http://127.0.0.1:8000 --output-dir runs/pipeline

Checkpoints (every ``--checkpoint-every`` steps) hold the stream cursor; ``--resume`` restarts from
the latest one and reads on from there: no item is trained twice and none is skipped. With
``--trained-log PATH`` every step appends the stream entry ids it trained on (an audit trail).
It prints one short line per step (``step 3: reward 0.250 loss -0.012 staleness 0.50 0.4 s``), writes
every stat to ``<output-dir>/metrics.jsonl`` and ends with the training reward of the first and last step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM

from ludic.distributed import BroadcastPolicyPublisher, ClientPublisher
from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_grpo
from ludic.training.loggers import JsonlLogger, before_after
from ludic.training.pipeline import PipelineBatchSource, PipelineVersionPublisher
from ludic.training.types import SAWBatch

PUBLISH_MODES = ("blob", "gloo", "shm")


class AuditedSource:
    """Forwards to the pipeline source, appending (and fsyncing) each batch's entry ids to a file."""

    def __init__(self, inner: PipelineBatchSource, path: str, trainer: Any = None) -> None:
        self.inner, self.path, self.trainer = inner, path, trainer

    async def next_batch(self) -> SAWBatch:
        batch = await self.inner.next_batch()
        line = {"step": self.trainer.step + 1, "ids": [it.meta["pipeline_item_id"] for it in batch.items]}
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return batch

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    async def on_checkpoint_saved(self, state: dict[str, Any]) -> None:
        await self.inner.on_checkpoint_saved(state)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default=os.environ.get("LUDIC_REDIS_URL"), help="default $LUDIC_REDIS_URL")
    p.add_argument("--run-id", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--server-url", default=None, help="publish weights to this Ludic server")
    p.add_argument("--publish", choices=PUBLISH_MODES, default="blob",
                   help="how weights reach the server: one safetensors upload (blob), vLLM's weight-transfer "
                        "routes over gloo, or over shared memory (shm: the server on this host)")  # fmt: skip
    p.add_argument("--output-dir", default="runs/pipeline")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=64, help="items per step")
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--resume", action="store_true", help="start from the latest checkpoint if any")
    p.add_argument("--trained-log", default=None)
    return p.parse_args(argv)


def build_trainer(args: argparse.Namespace) -> Trainer:
    model = AutoModelForCausalLM.from_pretrained(args.model_dir)
    source = PipelineBatchSource(
        redis_url=args.redis_url, run_id=args.run_id, batch_size=args.batch_size,
        vocab_size=model.get_input_embeddings().num_embeddings, max_staleness=args.max_staleness,
    )  # fmt: skip
    inner = None
    if args.server_url:
        from ludic.inference import VLLMChatClient

        client = VLLMChatClient(base_url=args.server_url, enable_weight_updates=True)
        if args.publish == "blob":
            inner = ClientPublisher(client)
        else:
            inner = BroadcastPolicyPublisher(client, backend=args.publish)
    trainer = Trainer(
        model=model,
        algo=make_grpo(group_size=args.group_size),
        batch_source=source,
        publisher=PipelineVersionPublisher(inner, redis_url=args.redis_url, run_id=args.run_id),
        cfg=TrainerConfig(
            lr=args.lr, max_seq_len=256, micro_token_budget=256 * 64, max_grad_norm=1.0,
            pad_token_id=int(model.config.pad_token_id or 0), sync_every_steps=1,
        ),
        checkpoint_config=CheckpointConfig(output_dir=args.output_dir, every_n_steps=args.checkpoint_every),
        train_logger=JsonlLogger(Path(args.output_dir) / "metrics.jsonl"),  # every stat of every step
    )  # fmt: skip
    if args.trained_log:
        trainer.batch_source = AuditedSource(source, args.trained_log, trainer)
    return trainer


async def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    if not args.redis_url:
        raise SystemExit("pass --redis-url or set $LUDIC_REDIS_URL")
    trainer = build_trainer(args)
    if args.resume and (Path(args.output_dir) / "latest.json").is_file():
        trainer.load_checkpoint()
        print(f"resumed at step {trainer.step}", flush=True)
    history: list[dict[str, float]] = []
    while trainer.step < args.steps:
        history.append(await trainer.train_step())
        print(step_line(trainer.step, history[-1]), flush=True)
    trainer.save_checkpoint()
    trainer.train_logger.close()
    print_idle([(h.get("train/pipeline/wait_seconds", 0.0), h["perf/step_seconds"]) for h in history][WARMUP_STEPS:])
    if history:
        first, last = (h.get("train/avg_total_reward", float("nan")) for h in (history[0], history[-1]))
        print(before_after(f"train reward over {len(history)} steps:", first, last), flush=True)
    return history[-1] if history else {}


def step_line(step: int, stats: dict[str, float]) -> str:
    """``step 3: reward 0.250 loss -0.012 staleness 0.50 0.4 s`` (every stat is in metrics.jsonl)."""
    return (f"step {step}: reward {stats.get('train/avg_total_reward', float('nan')):.3f} "
            f"loss {stats.get('train/loss', float('nan')):.3f} "
            f"staleness {stats.get('train/pipeline/mean_staleness', 0):.2f} {stats['perf/step_seconds']:.1f} s")  # fmt: skip


WARMUP_STEPS = 3
"""Steps left out of the idle summary (model load, first batches, first compile)."""


def print_idle(timed: list[tuple[float, float]]) -> None:
    """The trainer's idle fraction: time waiting in ``next_batch`` over the wall time of the steps."""
    if not timed:
        return
    waited, wall = sum(w for w, _ in timed), sum(s for _, s in timed)
    print(f"trainer idle {waited / wall:.1%} of {wall:.1f} s over {len(timed)} steps "
          f"(after {WARMUP_STEPS} warm-up steps), {wall / len(timed):.3f} s/step", flush=True)  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
