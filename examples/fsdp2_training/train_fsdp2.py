"""The quickstart's task trained with FSDP2 under ``torchrun``: SFT warm start, then GRPO, on CPUs or GPUs.

    # 2 CPU processes, gloo, a tiny model, the embedded inference engine on rank 0 (a few minutes):
    torchrun --nproc_per_node=2 examples/fsdp2_training/train_fsdp2.py
    # N GPUs, NCCL, bf16 compute, a separate inference server (vLLM, or python -m ludic.inference.server M):
    torchrun --nproc_per_node=4 examples/fsdp2_training/train_fsdp2.py --model M \
        --server-url http://127.0.0.1:8000 --param-dtype bf16 --output-dir runs/fsdp2

The task is ``ludic quickstart``'s: "Repeat c 4 times." -> ``cccc`` (letters a-h, partial credit per
character). A from-scratch model almost never answers right, so a short SFT on demonstrations comes
first, then GRPO. Both phases are the same Trainer on the sharded model: rank 0 generates every
macro-batch (``Rank0BatchSource``) and publishes the weights; every rank trains on its token-balanced
share. Rank 0 prints one short line per step, writes every stat to ``<output-dir>/metrics.jsonl`` and
ends with the held-out reward before and after GRPO (also in ``<output-dir>/summary.json``). See docs/fsdp.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.distributed import ClientPublisher, Rank0OnlyPublisher
from ludic.envs.letter_repeat import LetterRepeatEnv
from ludic.eval import Evaluator
from ludic.inference import SamplingConfig, TransformersChatClient, VLLMChatClient
from ludic.interaction import SingleAgentSyncProtocol
from ludic.parsers import ParseResult
from ludic.quickstart.demonstrations import demonstration_items
from ludic.testing import build_tiny_model
from ludic.training import (
    CheckpointConfig,
    OfflineBatchSource,
    RolloutBatchSource,
    RolloutEngine,
    SeededRequests,
    Trainer,
    TrainerConfig,
    make_grpo,
    make_sft,
    seeded_episode,
)
from ludic.training.loggers import before_after, progress_and_metrics
from ludic.training.parallel.batch import Rank0BatchSource
from ludic.training.parallel.collectives import broadcast_json
from ludic.training.parallel.fsdp import FSDPConfig, exit_distributed, init_distributed, shard_model
from ludic.training.parallel.publish import export_pretrained

LETTERS, COUNT = "abcdefgh", 4  # the quickstart's task: chance reward is about 1/8 per character
SFT_SEEDS, EVAL_SEEDS = 500_000, 1_000_000  # demonstrations and held-out prompts never meet training seeds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory or hub name (default: a tiny model)")
    p.add_argument("--server-url", default=None, help="inference server (vLLM or ludic.inference.server)")
    p.add_argument("--steps", type=int, default=100, help="GRPO steps")
    p.add_argument("--sft-steps", type=int, default=30, help="SFT warm-start steps (16 demonstrations each)")
    p.add_argument("--prompts", type=int, default=4, help="GRPO groups per step")
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-4, help="GRPO learning rate (linear warm-up, then decay)")
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--eval-episodes", type=int, default=64, help="held-out prompts per evaluation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--param-dtype", default=None, help="FSDP compute dtype: bf16 on GPUs, none on CPU")
    p.add_argument("--cpu-offload", action="store_true")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--output-dir", default="runs/fsdp2", help="metrics.jsonl, DCP checkpoints, final export")
    return p.parse_args(argv)


def shared_model_dir(args: argparse.Namespace, scratch: str) -> str:
    """``--model``, or a tiny model rank 0 builds in its ``scratch`` and names to the others."""
    if args.model is not None:
        return args.model
    if torch.distributed.get_rank() == 0:
        return broadcast_json(str(build_tiny_model(scratch, seed=args.seed)))
    return broadcast_json(None)


class Rank0:
    """What only rank 0 builds: the inference client, the rollout engine, the held-out evaluator."""

    def __init__(self, args: argparse.Namespace, model_dir: str, device: str) -> None:
        self.client: Any = (
            VLLMChatClient(base_url=args.server_url, enable_weight_updates=True)
            if args.server_url else TransformersChatClient(model_dir, device=device, model_name="policy")
        )  # fmt: skip
        self.engine = RolloutEngine(
            env_registry={"letters": lambda: LetterRepeatEnv(count=COUNT, letters=LETTERS)},
            protocol_registry={"single": self.protocol},
        )
        sampling = SamplingConfig(temperature=1.0, max_tokens=16)
        self.episode = seeded_episode("letters", "single", sampling=sampling, seed_sampling=False)  # training
        held_out_episode = seeded_episode("letters", "single", sampling=sampling)  # fixed sampling seeds too
        held_out = [held_out_episode(EVAL_SEEDS + i) for i in range(args.eval_episodes)]
        self.evaluator = Evaluator(engine=self.engine, requests=held_out, max_steps=1, concurrency=64)

    def protocol(self) -> SingleAgentSyncProtocol:  # a fresh agent per episode: agents keep state
        agent = Agent(client=self.client, model="policy", ctx=FullDialog(), parser=lambda t: ParseResult(t.strip()))
        return SingleAgentSyncProtocol(agent=agent)

    async def held_out_reward(self) -> float:
        """Mean reward on the held-out prompts, sampled at temperature 1 with fixed seeds."""
        return (await self.evaluator.evaluate())["eval/avg_total_reward"]


async def warm_start(model: Any, args: argparse.Namespace, r0: Rank0 | None, device: str) -> None:
    """SFT on the quickstart's demonstrations, sharded like the RL phase; rank 0 reads the data."""
    def source() -> OfflineBatchSource:
        seeds = range(SFT_SEEDS, SFT_SEEDS + 16 * args.sft_steps)
        items = demonstration_items(r0.client.tokenizer, seeds=seeds, count=COUNT, letters=LETTERS)
        return OfflineBatchSource(items, batch_size=16, shuffle=False)

    sft = Trainer(
        model=model, algo=make_sft(), batch_source=Rank0BatchSource(source),
        publisher=Rank0OnlyPublisher(lambda: ClientPublisher(r0.client)),
        cfg=TrainerConfig(lr=args.sft_lr, max_seq_len=256, micro_token_budget=4096, model_device=device),
    )  # fmt: skip
    await sft.train(args.sft_steps)
    if r0 is not None and hasattr(r0.client, "restart_versions"):
        r0.client.restart_versions(0)  # the RL trainer publishes version = its step, counting from 1 again


def grpo_trainer(model: Any, args: argparse.Namespace, r0: Rank0 | None, device: str) -> Trainer:
    """GRPO with the quickstart's settings; rank 0 makes the batches, publishes and logs."""
    algo = make_grpo(group_size=args.group_size)

    def source() -> RolloutBatchSource:
        return RolloutBatchSource(
            engine=r0.engine, algorithm=algo, max_steps=1, concurrency=args.prompts * args.group_size,
            request_fn=SeededRequests(r0.episode, per_step=args.prompts, next_seed=args.seed * 100_000),
        )  # fmt: skip

    out = Path(args.output_dir)
    cfg = TrainerConfig(
        lr=args.lr, lr_schedule="linear", warmup_steps=min(20, args.steps), total_steps=args.steps,
        max_seq_len=256, micro_token_budget=4096, model_device=device,
    )  # fmt: skip
    world = torch.distributed.get_world_size()
    return Trainer(
        model=model, algo=algo, batch_source=Rank0BatchSource(source), cfg=cfg,
        publisher=Rank0OnlyPublisher(lambda: ClientPublisher(r0.client)),
        train_logger=progress_and_metrics(out / "metrics.jsonl", f"[fsdp2 x{world}]", total_steps=args.steps)
        if r0 is not None else None,
        checkpoint_config=CheckpointConfig(out / "checkpoints", every_n_steps=50, max_to_keep=1),
    )  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, float]:
    """Every rank runs this; only rank 0 generates, evaluates and prints. Returns rank 0's figures."""
    with tempfile.TemporaryDirectory(prefix="ludic-fsdp2-") as scratch:  # a built tiny model, removed after
        return await train(args, shared_model_dir(args, scratch))


async def train(args: argparse.Namespace, model_dir: str) -> dict[str, float]:
    """Warm start, GRPO and the held-out evaluations on ``model_dir``, sharded over the ranks."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(args.seed)
    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    shard_model(model, FSDPConfig(param_dtype=args.param_dtype, cpu_offload=args.cpu_offload,
                                  activation_checkpointing=args.activation_checkpointing))  # fmt: skip
    r0 = Rank0(args, model_dir, device) if rank == 0 else None
    report: dict[str, float] = {}
    if r0 is not None:
        report["initial"] = await r0.held_out_reward()
    if args.sft_steps:
        await warm_start(model, args, r0, device)
    if r0 is not None:
        report["start_of_rl"] = await r0.held_out_reward()
        print(f"[fsdp2 x{world}] held-out reward {report['initial']:.3f} initial, "
              f"{report['start_of_rl']:.3f} after {args.sft_steps} SFT steps", flush=True)  # fmt: skip
    trainer = grpo_trainer(model, args, r0, device)
    history = await trainer.train(args.steps)
    export_pretrained(trainer.model, Path(args.output_dir) / "final")
    if r0 is not None:
        report["end"] = await r0.held_out_reward()
        report["seconds_per_step"] = sum(h["perf/step_seconds"] for h in history) / max(len(history), 1)
        print(before_after(f"held-out reward over {args.steps} GRPO steps:", report["start_of_rl"],
                           report["end"], prefix=f"[fsdp2 x{world}]"), flush=True)  # fmt: skip
        (Path(args.output_dir) / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    trainer.close()
    return report


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hf_logging.disable_progress_bar()  # no "Loading weights" bars between the progress lines
    init_distributed()
    asyncio.run(run(args))
    exit_distributed()  # destroys the groups, then exits without finalizing (see its docstring)


if __name__ == "__main__":
    main()
