"""Packed rows' attention by blocks vs over the rows' dense L x L mask: the GRPO training step, side by side.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_block_attention.py [--sizes 0.8M 6M 25M --replies 32 128]

``Trainer.train_step`` of GRPO on 4 prompts (69 tokens) x 8 replies (the TRL curve's cells,
``bench_vs_trl_curve.py``, with replies at their cap), fixed batches, with
``TrainerConfig(block_attention=False)`` (one SDPA call per layer over a 4D mask) and ``True``
(``kernels/cpu/segment_attention.py``), each with a model of its own built from the same weights,
interleaved in every round; medians. Also prints the query-key pairs each layout computes.
"""

from __future__ import annotations

import argparse

import torch
from bench_train_matmuls import GROUP, PROMPTS, SIZES, VOCAB, grpo_batch, step_medians

from ludic.training.layout.forward import plan_micro_batches


def pairs(model: torch.nn.Module, reply_len: int, blocks: bool) -> int:
    """Query-key pairs per head and layer the step's attention computes."""
    mbs = plan_micro_batches(
        model, grpo_batch(0, reply_len).items, micro_token_budget=16384, max_seq_len=512, block_attention=blocks
    )
    if not blocks:
        return sum(len(mb.plan.rows) * mb.plan.row_length**2 for mb in mbs if mb.plan is not None)
    from ludic.training.layout.packing import pack_plan

    return sum(pack_plan(mb.plan, pad_token_id=0, device="cpu", dense_mask=False).blocks.pairs for mb in mbs)


def bench(size: str, reply_len: int, repeats: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, attn_implementation="sdpa", **SIZES[size]))
    a, b = step_medians(base, "block_attention", repeats, reply_len)
    dense, blocked = pairs(base, reply_len, False), pairs(base, reply_len, True)
    print(
        f"  {size}, replies of {reply_len}: {a:.3f} / {b:.3f} s/step: blocks {a / b:.2f}x "
        f"(pairs per head and layer {dense:,} / {blocked:,}: {dense / blocked:.1f}x fewer)",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    p.add_argument("--replies", nargs="+", type=int, default=[32, 128])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    print(f"training step, GRPO, {PROMPTS} prompts x {GROUP} replies, s/step (medians of {args.repeats}): "
          "dense mask / blocks")  # fmt: skip
    for size in args.sizes:
        for reply_len in args.replies:
            bench(size, reply_len, args.repeats)


if __name__ == "__main__":
    main()
