"""Token-budget micro-batching and the lean token log-prob computation, measured on the CPU.

Prints, for a synthetic macro-batch whose lengths are drawn uniformly between 32 and max_seq_len:
1. real / computed tokens of padding-free packing (what the Trainer does for tested architectures),
   token-budget padded batching, and fixed-count batching with the same number of micro-batches
   (random order, as a fixed grad_accum_steps split gives);
2. train-step tokens/s of the three with a tiny real Qwen2 model (forward, GRPO loss, backward,
   AdamW), interleaved, median of ``--repeats``;
3. peak memory over forward + backward of the action tokens' log-probs from the last hidden states:
   plain ``log_softmax(hidden @ W.T)`` vs the chunked head (``ludic/training/loss/head_logps.py``), and the
   chunked log-probs from full logits, on a 150k vocabulary, each in a fresh subprocess (VmHWM).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_training.py
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from ludic.training.layout.forward import MicroBatch, micro_batch_loss, plan_micro_batches
from ludic.training.layout.micro_batching import split_items_by_token_budget
from ludic.training.loss import TokenClippedSurrogateLoss, compute_token_logps
from ludic.training.loss.head_logps import head_token_logps
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWItem

VOCAB = 259


def synthetic_items(n: int, max_seq_len: int, seed: int) -> list[SAWItem]:
    rng = random.Random(seed)
    items = []
    for i in range(n):
        length = rng.randint(32, max_seq_len)
        n_prompt = rng.randint(8, 24)
        n_action = length - n_prompt
        items.append(
            SAWItem(
                input_ids=[rng.randrange(3, VOCAB) for _ in range(length)],
                attention_mask=[1] * length,
                action_mask=[0] * n_prompt + [1] * n_action,
                weight=rng.choice([-1.0, 1.0]),
                meta={"rollout_id": str(i), "step_index": 0},
                attachments=SampleAttachments(ActorTokenLogps([-5.5] * n_action)),
            )
        )
    return items


def fixed_count_split(items: list[SAWItem], num: int, seed: int) -> list[list[SAWItem]]:
    shuffled = list(items)
    random.Random(seed).shuffle(shuffled)
    size = -(-len(shuffled) // num)
    return [shuffled[i : i + size] for i in range(0, len(shuffled), size)]


def efficiency(batches: list[list[SAWItem]]) -> tuple[int, int]:
    real = sum(len(it.input_ids) for mb in batches for it in mb)
    padded = sum(max(len(it.input_ids) for it in mb) * len(mb) for mb in batches)
    return real, padded


def tiny_model(seed: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    return Qwen2ForCausalLM(cfg)


def train_step_seconds(model: torch.nn.Module, batches: list[MicroBatch]) -> float:
    """One full macro-batch step through the Trainer's own micro-batch forward."""
    loss_fn = TokenClippedSurrogateLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    n = sum(len(mb.items) for mb in batches)
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    for mb in batches:
        loss, _, _ = micro_batch_loss(model, loss_fn, mb, pad_token_id=0, device=torch.device("cpu"))
        (loss * len(mb.items) / n).backward()
    opt.step()
    return time.perf_counter() - t0


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        line = next(ln for ln in f if ln.startswith(field + ":"))
    return int(line.split()[1]) / 1024  # kB


def memory_worker(mode: str, N: int, H: int, V: int) -> dict[str, Any]:
    """Run in a fresh process: the peak memory over forward + backward of N tokens' log-probs.

    Peak = VmHWM after resetting it (``/proc/self/clear_refs``), since ru_maxrss is inherited
    from the parent across fork/exec. All modes start from hidden [N, H] and a head W [V, H].
    """
    torch.manual_seed(0)
    hidden = torch.randn(N, H).requires_grad_(True)
    weight = (torch.randn(V, H) * 0.05).requires_grad_(True)
    ids = torch.randint(0, V, (N,))
    weight.grad = torch.zeros_like(weight)  # the parameter's gradient exists in training anyway
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS watermark to the current RSS
    base = _status_mb("VmRSS")
    if mode == "plain":
        logits = hidden @ weight.t()  # [N, V]
        token_logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, None]).squeeze(-1)
    elif mode == "chunked_logits":  # the [N, V] logits exist, their log-softmax never does
        token_logps = compute_token_logps((hidden @ weight.t())[None], torch.cat([ids[:1], ids])[None, : N])[0]
    else:
        token_logps = head_token_logps(hidden, weight, None, ids)
    token_logps.sum().backward()
    peak = _status_mb("VmHWM") - base
    return {"mode": mode, "peak_mb": peak, "logits_mb": N * V * 4 / 2**20}


def measure_memory(N: int, H: int, V: int) -> dict[str, dict[str, Any]]:
    out = {}
    for mode in ("plain", "chunked_logits", "hidden"):
        cmd = [sys.executable, __file__, "--memory-worker", mode, "--mem-shape", f"{N},{H},{V}"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[mode] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--budget", type=int, default=4096, help="micro_token_budget")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mem-shape", default="1024,256,150000", help="N,H,V for the memory comparison")
    p.add_argument("--memory-worker", choices=["plain", "chunked_logits", "hidden"], help=argparse.SUPPRESS)
    args = p.parse_args()
    N, H, V = (int(x) for x in args.mem_shape.split(","))
    if args.memory_worker:
        print(json.dumps(memory_worker(args.memory_worker, N, H, V)))
        return

    items = synthetic_items(args.items, args.max_seq_len, args.seed)
    model = tiny_model(args.seed)
    budget_mbs = split_items_by_token_budget(
        items, micro_token_budget=args.budget, max_seq_len=args.max_seq_len
    )
    packed = plan_micro_batches(model, items, micro_token_budget=args.budget, max_seq_len=args.max_seq_len)
    assert all(mb.plan is not None for mb in packed)
    fixed_mbs = fixed_count_split(items, len(budget_mbs), args.seed)
    (real, pad_budget), (_, pad_fixed) = efficiency(budget_mbs), efficiency(fixed_mbs)
    pad_packed = sum(len(mb.plan.rows) * mb.plan.row_length for mb in packed)  # type: ignore[union-attr]
    print(
        f"{args.items} items, lengths U[32, {args.max_seq_len}], {real} real tokens, budget {args.budget}: "
        f"{len(packed)} packed, {len(budget_mbs)} token-budget, {len(fixed_mbs)} fixed-count micro-batches"
    )
    print(
        f"real / computed tokens  packed {real / pad_packed:.3f}   token-budget {real / pad_budget:.3f}   "
        f"fixed-count {real / pad_fixed:.3f}"
    )
    variants = {
        "packed": packed,
        "token-budget": [MicroBatch(mb) for mb in budget_mbs],
        "fixed-count": [MicroBatch(mb) for mb in fixed_mbs],
    }
    train_step_seconds(model, packed[:1])  # warm-up
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats):  # interleaved
        for name, mbs in variants.items():
            times[name].append(train_step_seconds(model, mbs))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        "train step (median)     "
        + "   ".join(f"{k} {real / t:,.0f} tok/s ({t:.2f} s)" for k, t in med.items())
        + f"   packed vs token-budget {med['token-budget'] / med['packed']:.2f}x"
    )

    mem = measure_memory(N, H, V)
    plain, chunked, hidden = mem["plain"], mem["chunked_logits"], mem["hidden"]
    print(
        f"log-probs of {N} tokens, hidden {H}, vocabulary {V} ([N, V] logits = {plain['logits_mb']:.0f} MB fp32), "
        "peak memory over forward + backward above the inputs:"
    )
    print(
        f"  plain log_softmax {plain['peak_mb']:.0f} MB   chunked from full logits {chunked['peak_mb']:.0f} MB   "
        f"chunked from hidden states {hidden['peak_mb']:.0f} MB "
        f"({hidden['peak_mb'] / max(plain['peak_mb'], 0.1):.3f}x of plain)"
    )


if __name__ == "__main__":
    main()
