"""GRPO on one-digit addition with the Trainer under FSDP2 (``torchrun``), on CPUs or GPUs.

    # 2 CPU processes, gloo, tiny model, embedded inference engine on rank 0:
    torchrun --nproc_per_node=2 examples/fsdp2_training/train_fsdp2.py --steps 10
    # N GPUs, NCCL, bf16 compute, a separate inference server (vLLM, or python -m ludic.inference.server M):
    torchrun --nproc_per_node=4 examples/fsdp2_training/train_fsdp2.py --model M \
        --server-url http://127.0.0.1:8000 --param-dtype bf16 --output-dir runs/fsdp2

Rank 0 generates every macro-batch (``Rank0BatchSource``) and publishes weights gathered one layer at a
time; every rank trains on its token-balanced share. See docs/fsdp.md.

With the default tiny model (random weights, no warm start) this is a wiring demo of FSDP2 training on
CPUs: ranks, sharded steps, checkpoints, the publish path; its reward is not shown to rise. Pass
``--model`` with a model that can already add for the reward to move.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.distributed import ClientPublisher, Rank0OnlyPublisher
from ludic.distributed.collectives import broadcast_json
from ludic.distributed.fsdp import FSDPConfig, exit_distributed, init_distributed, shard_model
from ludic.envs import SingleAgentEnv
from ludic.inference import InferenceSpec, SamplingConfig, TransformersChatClient, VLLMChatClient
from ludic.interaction import SingleAgentSyncProtocol
from ludic.parsers import ParseResult
from ludic.testing import build_tiny_model
from ludic.training import (
    CheckpointConfig,
    EnvSpec,
    GRPORequestStrategy,
    PrintLogger,
    ProtocolSpec,
    RolloutBatchSource,
    RolloutEngine,
    RolloutRequest,
    Trainer,
    TrainerConfig,
    make_grpo,
)
from ludic.training.distributed_batch import Rank0BatchSource
from ludic.training.distributed_publish import export_pretrained
from ludic.types import StepOutcome

GROUP = 8


class AddEnv(SingleAgentEnv):
    """One step: "a+b=" with one-digit a, b; reward 1 when the reply is the sum."""

    def env_reset(self, *, seed: int | None = None):
        rng = random.Random(seed)
        self.a, self.b = rng.randint(0, 4), rng.randint(0, 4)
        return self.env_current_obs(), {}

    def env_step(self, action: str) -> StepOutcome:
        hit = action.strip() == str(self.a + self.b)
        return StepOutcome(None, float(hit), False, True, {"hit": hit})

    def env_current_obs(self) -> str:
        return f"{self.a}+{self.b}="


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory or hub name (default: a tiny model)")
    p.add_argument("--server-url", default=None, help="inference server (vLLM or ludic.inference.server)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prompts", type=int, default=4, help="GRPO groups per step (x8 samples)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--param-dtype", default=None, help="FSDP compute dtype: bf16 on GPUs, none on CPU")
    p.add_argument("--cpu-offload", action="store_true")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--output-dir", default=None, help="DCP checkpoints + final safetensors export here")
    return p.parse_args()


def shared_model_dir(arg: str | None) -> str:
    """``--model``, or a tiny model rank 0 builds and names to the others."""
    if arg is not None:
        return arg
    path = str(build_tiny_model(tempfile.mkdtemp(prefix="ludic-fsdp2-"))) if torch.distributed.get_rank() == 0 else None
    return broadcast_json(path)


def make_batch_source(args: argparse.Namespace, client: Any, algo: Any) -> RolloutBatchSource:
    def protocol() -> SingleAgentSyncProtocol:
        agent = Agent(client=client, model="policy", ctx=FullDialog(), parser=lambda t: ParseResult(t))
        return SingleAgentSyncProtocol(agent=agent)

    engine = RolloutEngine(env_registry={"add": AddEnv}, protocol_registry={"single": protocol})
    seeds = iter(range(10**9))
    sampling = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=3))
    return RolloutBatchSource(
        engine=engine,
        request_fn=lambda: [
            RolloutRequest(EnvSpec("add"), ProtocolSpec("single"), env_seed=next(seeds), inference=sampling)
            for _ in range(args.prompts)
        ],
        algorithm=algo,
        max_steps=1,
        request_strategy=GRPORequestStrategy(group_size=GROUP),
        concurrency=64,
    )


def main() -> None:
    args = parse_args()
    rank, world = init_distributed()
    model_dir = shared_model_dir(args.model)
    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    shard_model(model, FSDPConfig(param_dtype=args.param_dtype, cpu_offload=args.cpu_offload,
                                  activation_checkpointing=args.activation_checkpointing))  # fmt: skip
    clients: dict[str, Any] = {}

    def client() -> Any:  # built on rank 0 only, once, shared by the batch source and the publisher
        if "c" not in clients:
            clients["c"] = (
                VLLMChatClient(base_url=args.server_url, enable_weight_updates=True)
                if args.server_url else TransformersChatClient(model_dir, device=device)
            )  # fmt: skip
        return clients["c"]

    algo = make_grpo(group_size=GROUP)
    trainer = Trainer(
        model=model,
        algo=algo,
        batch_source=Rank0BatchSource(lambda: make_batch_source(args, client(), algo)),
        publisher=Rank0OnlyPublisher(lambda: ClientPublisher(client())),
        cfg=TrainerConfig(lr=args.lr, max_seq_len=256, micro_token_budget=2048, model_device=device),
        train_logger=PrintLogger(prefix=f"[fsdp2 x{world}]"),
        checkpoint_config=CheckpointConfig(args.output_dir, every_n_steps=5) if args.output_dir else None,
    )
    stats = trainer.train_sync(args.steps)[-1]  # the last step's stats
    if args.output_dir:
        export_pretrained(trainer.model, f"{args.output_dir}/final")
    if rank == 0:
        print(f"done: {trainer.step} steps on {world} ranks, reward {stats.get('train/avg_total_reward', 0):.3f}")
    trainer.close()
    exit_distributed()  # destroys the groups, then exits without finalizing (see its docstring)


if __name__ == "__main__":
    main()
