"""Token-budget micro-batching and the lean token log-prob computation, measured on the CPU.

Prints, for a synthetic macro-batch whose lengths are drawn uniformly between 32 and max_seq_len:
1. padded-token efficiency (real / padded tokens) of token-budget batching vs fixed-count batching
   with the same number of micro-batches (random order, as a fixed grad_accum_steps split gives);
2. train-step tokens/s of both with a tiny real Qwen2 model (forward, GRPO loss, backward, AdamW);
3. peak memory of the loss's log-prob computation (forward + backward) vs a naive full
   ``log_softmax(logits).gather(...)``, each in a fresh subprocess (ru_maxrss increase).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_training.py
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from typing import Any

import torch

from ludic.training.batching.micro_batching import collate_saw_items, split_items_by_token_budget
from ludic.training.loss import TokenClippedSurrogateLoss, compute_token_logps
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


def train_step_seconds(model: torch.nn.Module, batches: list[list[SAWItem]], repeats: int) -> float:
    """Best of ``repeats`` timings of one full macro-batch step."""
    loss_fn = TokenClippedSurrogateLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    n = sum(len(mb) for mb in batches)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for mb_items in batches:
            mb = collate_saw_items(mb_items, pad_token_id=0, device="cpu")
            logits = model(
                input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], use_cache=False
            ).logits
            loss, _ = loss_fn.compute(logits, mb)
            (loss * len(mb_items) / n).backward()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    return best


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        line = next(ln for ln in f if ln.startswith(field + ":"))
    return int(line.split()[1]) / 1024  # kB


def memory_worker(mode: str, B: int, T: int, V: int) -> dict[str, Any]:
    """Run in a fresh process: memory held after the forward, and the peak over forward + backward.

    Peak = VmHWM after resetting it (``/proc/self/clear_refs``), since ru_maxrss is inherited
    from the parent across fork/exec.
    """
    torch.manual_seed(0)
    logits = torch.empty(B, T, V).normal_().requires_grad_(True)
    ids = torch.randint(0, V, (B, T))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS watermark to the current RSS
    base = _status_mb("VmRSS")
    if mode == "naive":
        full = torch.log_softmax(logits, dim=-1)  # [B, T, V] kept alive for backward
        token_logps = full[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        del full
    else:
        token_logps = compute_token_logps(logits, ids)
    held = _status_mb("VmRSS") - base
    token_logps.sum().backward()
    peak = _status_mb("VmHWM") - base
    return {"mode": mode, "held_mb": held, "peak_mb": peak, "logits_mb": logits.numel() * 4 / 2**20}


def measure_memory(B: int, T: int, V: int) -> dict[str, dict[str, Any]]:
    out = {}
    for mode in ("naive", "lean"):
        cmd = [sys.executable, __file__, "--memory-worker", mode, "--mem-shape", f"{B},{T},{V}"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[mode] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--budget", type=int, default=4096, help="micro_token_budget")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mem-shape", default="2,1024,32768", help="B,T,V for the memory comparison")
    p.add_argument("--memory-worker", choices=["naive", "lean"], help=argparse.SUPPRESS)
    args = p.parse_args()
    B, T, V = (int(x) for x in args.mem_shape.split(","))
    if args.memory_worker:
        print(json.dumps(memory_worker(args.memory_worker, B, T, V)))
        return

    items = synthetic_items(args.items, args.max_seq_len, args.seed)
    budget_mbs = split_items_by_token_budget(
        items, micro_token_budget=args.budget, max_seq_len=args.max_seq_len
    )
    fixed_mbs = fixed_count_split(items, len(budget_mbs), args.seed)
    (real, pad_budget), (_, pad_fixed) = efficiency(budget_mbs), efficiency(fixed_mbs)
    print(
        f"{args.items} items, lengths U[32, {args.max_seq_len}], {real} real tokens, "
        f"{len(budget_mbs)} micro-batches each"
    )
    print(
        f"padding efficiency  token-budget {real / pad_budget:.3f}   fixed-count {real / pad_fixed:.3f}   "
        f"(padded tokens {pad_budget} vs {pad_fixed}: {pad_fixed / pad_budget:.2f}x fewer)"
    )

    model = tiny_model(args.seed)
    train_step_seconds(model, budget_mbs[:1], 1)  # warm-up
    t_budget = train_step_seconds(model, budget_mbs, args.repeats)
    t_fixed = train_step_seconds(model, fixed_mbs, args.repeats)
    print(
        f"train step          token-budget {real / t_budget:,.0f} tok/s ({t_budget:.2f} s)   "
        f"fixed-count {real / t_fixed:,.0f} tok/s ({t_fixed:.2f} s)   speed-up {t_fixed / t_budget:.2f}x"
    )

    mem = measure_memory(B, T, V)
    naive, lean = mem["naive"], mem["lean"]
    print(f"log-probs of [B,T,V]=[{B},{T},{V}] logits ({naive['logits_mb']:.0f} MB fp32), memory above them:")
    print(
        f"  held between forward and backward: naive log_softmax {naive['held_mb']:.0f} MB, "
        f"chunked {lean['held_mb']:.1f} MB ({naive['held_mb'] / max(lean['held_mb'], 0.1):.0f}x less; its tensors "
        f"are only the [B,T] logsumexp, {B * T * 4 / 2**10:.0f} KiB: the rest is allocator slack)"
    )
    print(
        f"  peak over forward + backward:      naive log_softmax {naive['peak_mb']:.0f} MB, "
        f"chunked {lean['peak_mb']:.0f} MB ({naive['peak_mb'] / max(lean['peak_mb'], 0.1):.2f}x less; "
        f"the logits' own gradient is {naive['logits_mb']:.0f} MB of it)"
    )


if __name__ == "__main__":
    main()
