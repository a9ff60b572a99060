"""One training run for the FSDP2 tests: ``python fsdp_worker.py ...`` (one process, unsharded) or
``torchrun --nproc_per_node=2 fsdp_worker.py ...`` (gloo, FSDP2). Rank 0 writes ``result.json``
(per-step stats) and ``params.safetensors`` (the final full weights) into ``--out``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from ludic.training.algorithm import RLAlgorithm
from ludic.training.config import CheckpointConfig, TrainerConfig
from ludic.training.credit.assigners import EpisodicReturn
from ludic.training.loss import ReinforceLoss
from ludic.training.trainer import Trainer
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWBatch, SAWItem

faulthandler.enable()  # a rank that aborts (SIGABRT from C++) prints every thread's Python stack first

GLOBAL_BATCH = 7  # odd on purpose: the ranks get unequal item counts


def make_batch(step: int, vocab: int) -> SAWBatch:
    """The global macro-batch of ``step``: the same on every rank and in every run."""
    rng = random.Random(1000 + step)
    items = []
    for i in range(GLOBAL_BATCH):
        n = rng.randint(6, 30)  # some exceed max_seq_len=24 and are truncated
        prompt = rng.randint(2, 5)
        items.append(SAWItem(
            input_ids=[rng.randrange(3, vocab) for _ in range(n)],
            attention_mask=[1] * n,
            action_mask=[0] * prompt + [1] * (n - prompt),
            weight=rng.uniform(-0.5, 1.0),
            attachments=SampleAttachments(ActorTokenLogps([-rng.uniform(0.5, 6.0) for _ in range(n - prompt)])),
            meta={"rollout_id": f"s{step}-{i}", "total_reward": float(i % 2)},
        ))  # fmt: skip
    return SAWBatch(items=items, meta={"target_rollouts": GLOBAL_BATCH})


class SeededBatches:
    """Batch ``k`` for the trainer's k-th step, counting from ``start`` (a resumed run's step)."""

    def __init__(self, start: int, vocab: int) -> None:
        self.step, self.vocab = start, vocab

    async def next_batch(self) -> SAWBatch:
        self.step += 1
        return make_batch(self.step, self.vocab)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _try_loads(trainer: Trainer, folders: list[str]) -> list[str | None]:
    """Load each folder; the error message of each (None: it loaded). Asserts a failed load changed nothing."""
    from ludic.training.checkpoint.manager import CheckpointLoadError

    errors: list[str | None] = []
    for folder in folders:
        before = [_local(p).detach().clone() for p in trainer.model.parameters()]
        try:
            trainer.load_checkpoint(path=folder)
            errors.append(None)
        except CheckpointLoadError as exc:
            errors.append(str(exc))
            after = [_local(p) for p in trainer.model.parameters()]
            assert all(torch.equal(a, b) for a, b in zip(before, after)), f"{folder}: weights changed"
    return errors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ckpt-dir")
    ap.add_argument("--save-at", type=int, default=0, help="save a checkpoint after this step")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--try-load", default="", help="comma-separated checkpoint folders to try loading, in order")
    ap.add_argument("--export")
    ap.add_argument("--server-url")
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (one GPU per rank)")
    ap.add_argument("--param-dtype", default=None, help="FSDP MixedPrecisionPolicy compute dtype")
    args = ap.parse_args()
    torch.manual_seed(0)
    distributed = "RANK" in os.environ
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        for name, p in model.named_parameters():  # a non-zero B, so the merged delta is visible
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.05)
    if distributed:
        from ludic.training.parallel.fsdp import FSDPConfig, init_distributed, shard_model

        init_distributed(args.backend)
        if args.backend == "nccl":
            model.to(f"cuda:{torch.cuda.current_device()}")
        shard_model(model, FSDPConfig(param_dtype=args.param_dtype))
    publisher = None
    if args.server_url:
        from ludic.distributed import create_vllm_publisher
        from ludic.inference import VLLMChatClient

        publisher = create_vllm_publisher(
            VLLMChatClient(base_url=args.server_url, enable_weight_updates=True), rank0_only=True
        )
    # cpu_kernels="off": the one-process run is checked against FSDP2's, which runs torch's own layers (no oneDNN
    # linears, no recomputing MLPs and norms); with the CPU kernels on only there, the two differed by fp32 rounding
    # that 3 Adam steps grew to 1.2e-5 on an AMD EPYC host (and stayed under 1e-5 on a Xeon)
    cfg = TrainerConfig(
        lr=1e-2, max_seq_len=24, micro_token_budget=48, max_grad_norm=1e-3, pad_token_id=0,
        sync_every_steps=1 if publisher else 0, share_prompt_prefix=False, onednn_linears=False, cpu_kernels="off",
        model_device=f"cuda:{torch.cuda.current_device()}" if args.backend == "nccl" else "cpu",
    )  # fmt: skip
    ckpt = CheckpointConfig(output_dir=args.ckpt_dir) if args.ckpt_dir else None
    vocab = model.config.vocab_size if not args.lora else model.get_base_model().config.vocab_size
    algo = RLAlgorithm(name="reinforce", credit_assigner=EpisodicReturn(), loss=ReinforceLoss())
    trainer = Trainer(model=model, algo=algo, batch_source=SeededBatches(0, vocab), cfg=cfg,
                      checkpoint_config=ckpt, publisher=publisher)  # fmt: skip
    load_errors = _try_loads(trainer, [p for p in args.try_load.split(",") if p])
    if args.resume:
        trainer.load_checkpoint()
        trainer.batch_source = SeededBatches(trainer.step, vocab)
    history = []
    for _ in range(args.steps):
        history.append(trainer.train_step_sync())
        if args.save_at and trainer.step == args.save_at:
            trainer.save_checkpoint()
    from ludic.training.parallel.publish import export_pretrained, gather_publishable

    params = gather_publishable(trainer.model)
    if args.export:
        export_pretrained(trainer.model, args.export)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.clone().contiguous() for k, v in params.items()}, str(out / "params.safetensors"))
        result = {"history": history, "step": trainer.step, "load_errors": load_errors}
        (out / "result.json").write_text(json.dumps(result))
    else:
        assert params == {}, "only rank 0 receives the gathered weights"
    trainer.close()
    if distributed:
        from ludic.training.parallel.fsdp import exit_distributed

        exit_distributed()


if __name__ == "__main__":
    main()
