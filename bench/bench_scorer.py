"""The frozen-model scorer's cost next to the trainer's forward/backward on the same macro-batch.

Prints, for a synthetic macro-batch (lengths uniform in [32, max_seq_len]) and a real Qwen2 model:
1. seconds per step of ``FrozenModelScorer.score_items`` (forward only, no grad, reusing the trainer's
   log-prob helper) and of the trainer's per-step work on the same items (token-budget split, collate,
   forward, CISPO + KL loss, backward), interleaved and repeated; medians and their ratio (goal <= 0.4);
2. peak memory of each, in a fresh subprocess: on CUDA ``max_memory_allocated`` above what was allocated
   before, on the CPU the peak resident set size (sampled every ms) above the RSS before.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_scorer.py [--device cuda] [--hidden 256 ...]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import threading
from typing import Any

import torch
from timing import timed
from transformers import Qwen2Config, Qwen2ForCausalLM

from ludic.training._setup import forward_logits
from ludic.training.layout.micro_batching import collate_saw_items, split_items_by_token_budget
from ludic.training.presets import make_cispo
from ludic.training.reference.scoring import FrozenModelScorer
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWItem


def build_model(args: argparse.Namespace) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64 or 1,
        num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=4096,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg).to(args.device, dtype=getattr(torch, args.dtype))


def synthetic_items(n: int, max_seq_len: int, vocab: int, seed: int) -> list[SAWItem]:
    rng = random.Random(seed)
    items = []
    for i in range(n):
        length = rng.randint(32, max_seq_len)
        n_prompt = rng.randint(8, 24)
        items.append(
            SAWItem(
                [rng.randrange(3, vocab) for _ in range(length)], [1] * length,
                [0] * n_prompt + [1] * (length - n_prompt), rng.choice([-1.0, 1.0]),
                {"rollout_id": str(i)}, SampleAttachments(ActorTokenLogps([-5.5] * (length - n_prompt))),
            )
        )  # fmt: skip
    return items


def trainer_step(model: torch.nn.Module, algo: Any, items: list[SAWItem], args: argparse.Namespace) -> None:
    """What the Trainer does per step between preprocessing and the optimizer: split, forward, loss, backward."""
    micro = split_items_by_token_budget(items, micro_token_budget=args.budget, max_seq_len=args.max_seq_len)
    for mb_items in micro:
        mb = collate_saw_items(mb_items, pad_token_id=0, device=args.device)
        loss, _ = algo.loss.compute(forward_logits(model, mb), mb)
        (loss * len(mb_items) / len(items)).backward()
    model.zero_grad(set_to_none=True)


def compare_times(args: argparse.Namespace) -> dict[str, float]:
    policy = build_model(args)
    scorer = FrozenModelScorer(policy, micro_token_budget=args.budget)
    algo = make_cispo(kl_coeff=0.1, ref_model=scorer)
    items = synthetic_items(args.batch, args.max_seq_len, args.vocab, seed=0)
    scorer.score_items(items)  # warm-up, and every item carries ref_logps for the KL term
    trainer_step(policy, algo, items, args)
    score_s, train_s = [], []
    for _ in range(args.repeats):  # interleaved: the machine's load hits both alike
        score_s.append(timed(lambda: scorer.score_items(items), args.device))
        train_s.append(timed(lambda: trainer_step(policy, algo, items, args), args.device))
    s, t = statistics.median(score_s), statistics.median(train_s)
    return {"scorer_s": s, "trainer_fwd_bwd_s": t, "ratio": s / t}


class RssSampler:
    """Peak resident set size (MiB) seen by a thread reading /proc/self/statm every millisecond."""

    def __enter__(self) -> RssSampler:
        self.peak, self._stop = current_rss_mib(), threading.Event()
        self.start = self.peak
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, current_rss_mib())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, current_rss_mib())


def current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def peak_memory(args: argparse.Namespace, which: str) -> float:
    """MiB above the memory in use before one scorer pass or one trainer step (run in this process)."""
    policy = build_model(args)
    scorer = FrozenModelScorer(policy, micro_token_budget=args.budget)
    algo = make_cispo(kl_coeff=0.1, ref_model=scorer)
    items = synthetic_items(args.batch, args.max_seq_len, args.vocab, seed=0)
    for it in items:  # ref_logps present without a scoring pass before the measurement
        it.attachments.frozen_logps["ref_logps"] = [-5.0] * it.num_action_tokens
    run = (lambda: scorer.score_items(items)) if which == "scorer" else (lambda: trainer_step(policy, algo, items, args))
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    with RssSampler() as rss:
        run()
    return rss.peak - rss.start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=256)
    p.add_argument("--budget", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--memory-only", choices=["scorer", "trainer"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_only:
        print(json.dumps({"peak_mib": peak_memory(args, args.memory_only)}))
        return
    result = compare_times(args)
    for which in ("scorer", "trainer"):
        cmd = [sys.executable, __file__, "--memory-only", which, *sys.argv[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        result[f"{which}_peak_mib"] = json.loads(out.strip().splitlines()[-1])["peak_mib"]
    result["config"] = {k: v for k, v in vars(args).items() if k != "memory_only"}
    print(json.dumps(result, indent=2))
    print(f"scorer / trainer forward+backward: {result['ratio']:.2f}x (goal <= 0.4x); medians of "
          f"{args.repeats} interleaved runs on a shared machine")  # fmt: skip


if __name__ == "__main__":
    main()
