"""Prompt-prefix sharing in the Trainer: one GRPO micro-batch, forward + backward, shared vs plain.

GRPO sends every prompt G times. The plain path pads and runs G copies of it; the shared path
(``ludic.training.layout.shared_prefix``) runs it once per group. Both give the same loss and
gradients; this prints the seconds per forward+backward of each (best of ``--repeats``,
interleaved), their ratio, and the largest loss/gradient difference.

    .venv/bin/python bench/bench_shared_prefix.py                      # CPU, tiny model
    python bench/bench_shared_prefix.py --device cuda --dtype bfloat16 \\
        --hidden-size 1024 --layers 16 --prompt-len 512 --completion-len 256
"""

from __future__ import annotations

import argparse
import os
import random

os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch
from timing import timed
from transformers import AutoModelForCausalLM

from ludic.testing import tiny_model_path
from ludic.training._setup import forward_logits
from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.layout.micro_batching import collate_saw_items
from ludic.training.layout.shared_prefix import forward_shared_prefix_logits, pack_shared_prefix
from ludic.training.presets import make_grpo
from ludic.training.types import SAWItem


def grpo_items(
    groups: int, group_size: int, prompt_len: int, completion_len: int, vocab: int
) -> list[SAWItem]:
    """Completions of length U(completion_len / 4, completion_len), as sampled replies vary."""
    rng = random.Random(0)
    items = []
    for _ in range(groups):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        for _ in range(group_size):
            completion = [
                rng.randrange(3, vocab) for _ in range(rng.randint(completion_len // 4, completion_len))
            ]
            items.append(
                prompt_completion_item(
                    prompt, completion, weight=rng.uniform(-1, 1), actor_logps=[-1.0] * len(completion)
                )
            )
    return items


def step(
    model: torch.nn.Module, items: list[SAWItem], shared: bool, device: str
) -> tuple[float, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    if shared:
        dtype = next(model.parameters()).dtype
        packed = pack_shared_prefix(items, pad_token_id=0, device=device, dtype=dtype)
        batch, logits = packed.view, forward_shared_prefix_logits(model, packed)
    else:
        batch = collate_saw_items(items, pad_token_id=0, device=device)
        logits = forward_logits(model, batch)
    loss, _ = make_grpo(group_size=8).loss.compute(logits, batch)
    loss.backward()
    return float(loss.detach()), torch.cat(
        [p.grad.flatten().float() for p in model.parameters() if p.grad is not None]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=48)
    p.add_argument("--completion-len", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    path = tiny_model_path(
        hidden_size=args.hidden_size, num_layers=args.layers, intermediate_size=3 * args.hidden_size
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).to(args.device)
    items = grpo_items(
        args.groups, args.group_size, args.prompt_len, args.completion_len, model.config.vocab_size
    )
    (loss_plain, grad_plain), (loss_shared, grad_shared) = (
        step(model, items, s, args.device) for s in (False, True)
    )
    best = {False: float("inf"), True: float("inf")}
    for _ in range(args.repeats):
        for shared in (False, True):
            best[shared] = min(
                best[shared], timed(lambda s=shared: step(model, items, s, args.device), args.device)
            )
    params = sum(x.numel() for x in model.parameters()) / 1e6
    tokens = sum(len(it.input_ids) for it in items)
    print(
        f"{args.groups} groups x {args.group_size}, prompt {args.prompt_len}, completions <= {args.completion_len} "
        f"({tokens} tokens); Qwen2 {params:.1f}M params, {args.dtype}, {args.device}, best of {args.repeats}"
    )
    print(f"plain  forward+backward: {best[False] * 1e3:8.1f} ms")
    print(f"shared forward+backward: {best[True] * 1e3:8.1f} ms")
    print(f"speed-up: {best[False] / best[True]:.2f}x")
    scale = grad_plain.abs().max().item()
    print(
        f"|loss diff| {abs(loss_plain - loss_shared):.2e}; max |grad diff| / max |grad| "
        f"{(grad_plain - grad_shared).abs().max().item() / scale:.2e}"
    )


if __name__ == "__main__":
    main()
