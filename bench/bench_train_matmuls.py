"""Training on the CPU with the linear layers on oneDNN vs torch's default BLAS (MKL), side by side.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_train_matmuls.py [--sizes 0.8M 6M 25M --repeats 5]
    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_train_matmuls.py --layers smollm2 --rows 256 470 600 --steps 0

Two parts, each variant interleaved with the other in every round, medians:

- matmuls: GFLOP/s of the three products of one linear layer at training shapes (4,688 rows: 16 packed
  rows of 293 positions; ``--rows``), ``F.linear`` / ``mm`` (MKL) vs ``OneDNNLinear``'s (weight reordered
  every call), for the curve models' layer shapes or (``--layers smollm2``) SmolLM2-135M's, a 64 MB buffer
  written before each call so the inputs come from memory, as in a step;
- training step: ``Trainer.train_step`` of GRPO on 4 prompts (69 tokens) x 8 replies of 128 tokens, the
  TRL curve's 128-token cell (``bench_vs_trl_curve.py``), with ``TrainerConfig(onednn_linears=False)`` vs
  ``True``, each with a model of its own built from the same weights (fixed batches: no generation).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from curve_models import SIZES as CURVE_SIZES
from curve_models import qwen2_config

from ludic.kernels.cpu.onednn_linear import (
    inner_product,
    onednn_available,
    transposed_weight,
    weight_and_bias_grads,
)
from ludic.training import Trainer, TrainerConfig, make_grpo
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWBatch, SAWItem

SIZES = {name: qwen2_config(name) for name in CURVE_SIZES}  # Qwen2Config keywords
PROMPTS, GROUP, PROMPT_LEN, REPLY_LEN, VOCAB = 4, 8, 69, 128, 260
LAYERS = {
    "curve": ((128, 384), (256, 768), (768, 256), (512, 1536), (1536, 512)),
    "smollm2": ((576, 576), (576, 192), (576, 1536), (1536, 576)),  # q and o, k and v, gate and up, down
}


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def products(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> dict[str, tuple[Callable, Callable]]:
    """The three products of one linear layer's training step: (MKL, oneDNN) for each."""
    return {
        "forward": (lambda: F.linear(x, w), lambda: inner_product(x, w)),
        "grad input": (lambda: dy.mm(w), lambda: inner_product(dy, transposed_weight(w))),
        "grad weight": (lambda: dy.t().mm(x), lambda: weight_and_bias_grads(dy, x, w, False)),
    }


def bench_matmuls(repeats: int, rows_list: list[int], layers: str) -> None:
    flush = torch.empty(16 * 1024 * 1024)
    for rows in rows_list:
        print(f"matmuls, {rows} rows, GFLOP/s (medians of {repeats}, interleaved): MKL / oneDNN")
        for in_f, out_f in LAYERS[layers]:
            gflop = 2 * rows * in_f * out_f / 1e9
            line = []
            for name, pair in products(torch.randn(rows, in_f), torch.randn(out_f, in_f), torch.randn(rows, out_f)).items():
                times: dict[int, list[float]] = {0: [], 1: []}
                pair[0](), pair[1]()
                for r in range(repeats):
                    for k in (0, 1) if r % 2 == 0 else (1, 0):
                        flush.fill_(1.0)  # the inputs come from memory, as after a step's other layers
                        times[k].append(timed(pair[k]))
                a, b = (gflop / statistics.median(times[k]) for k in (0, 1))
                line.append(f"{name} {a:.0f} / {b:.0f} ({b / a:.2f}x)")
            print(f"  {in_f:>4} -> {out_f:<4}  " + "   ".join(line))


def grpo_batch(seed: int, reply_len: int = REPLY_LEN) -> SAWBatch:
    g = torch.Generator().manual_seed(seed)
    items = []
    for p in range(PROMPTS):
        prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=g).tolist()
        for r in range(GROUP):
            reply = torch.randint(0, VOCAB, (reply_len,), generator=g).tolist()
            items.append(SAWItem(
                input_ids=prompt + reply, attention_mask=[1] * (PROMPT_LEN + reply_len),
                action_mask=[0] * PROMPT_LEN + [1] * reply_len, weight=float(r % 3 - 1),
                meta={"rollout_id": f"{seed}-{p}-{r}", "request_meta": {"group_id": f"{seed}-{p}"}},
                attachments=SampleAttachments(actor_logps=ActorTokenLogps([-5.5] * reply_len)),
            ))  # fmt: skip
    return SAWBatch(items=items)


class Batches:
    """Fresh GRPO batches of ``reply_len``-token replies, one per step."""

    def __init__(self, reply_len: int = REPLY_LEN) -> None:
        self.n, self.reply_len = 0, reply_len

    async def next_batch(self) -> SAWBatch:
        self.n += 1
        return grpo_batch(self.n, self.reply_len)


def step_medians(base: torch.nn.Module, option: str, repeats: int, reply_len: int = REPLY_LEN) -> tuple[float, float]:
    """Median s/step of GRPO trainers with ``TrainerConfig(option=False)`` and ``True``, each with its own
    copy of ``base``'s weights, one step of each in turn per round (after a warm-up step each)."""
    trainers = {}
    for on in (False, True):
        model = type(base)(base.config)
        model.load_state_dict(base.state_dict())
        cfg = TrainerConfig(lr=1e-4, max_seq_len=512, micro_token_budget=16384, **{option: on})
        trainers[on] = Trainer(model=model, algo=make_grpo(group_size=GROUP), batch_source=Batches(reply_len), cfg=cfg)
    times: dict[bool, list[float]] = {False: [], True: []}
    for t in trainers.values():
        t.train_step_sync()  # warm-up
    for _ in range(repeats):
        for on, t in trainers.items():
            times[on].append(timed(t.train_step_sync))
    for t in trainers.values():
        t.close()
    return statistics.median(times[False]), statistics.median(times[True])


def bench_steps(sizes: list[str], repeats: int) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    print(f"\ntraining step, GRPO, {PROMPTS} prompts x {GROUP} replies, {PROMPT_LEN} + {REPLY_LEN} tokens, "
          f"s/step (medians of {repeats}): MKL / oneDNN")  # fmt: skip
    for size in sizes:
        torch.manual_seed(0)
        base = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, **SIZES[size]))
        a, b = step_medians(base, "onednn_linears", repeats)
        params = sum(p.numel() for p in base.parameters()) / 1e6
        print(f"  {size} ({params:.1f}M params): {a:.3f} / {b:.3f} s/step: oneDNN {a / b:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rows", type=int, nargs="+", default=[16 * 293], help="the matmuls' input rows")
    p.add_argument("--layers", choices=list(LAYERS), default="curve", help="the matmuls' layer shapes")
    p.add_argument("--steps", type=int, default=1, help="0: the matmuls alone, no training steps")
    args = p.parse_args()
    if not onednn_available():
        raise SystemExit("this torch build has no oneDNN")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads")
    bench_matmuls(args.repeats, args.rows, args.layers)
    if args.steps:
        bench_steps(args.sizes, args.repeats)


if __name__ == "__main__":
    main()
