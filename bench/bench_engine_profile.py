"""Where one decoding step of the embedded engine goes, per model size (32 rows, ~100 cached tokens).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_engine_profile.py [--sizes 0.8M 6M 25M --repeats 5]

Per size, one step (one new token for each of 32 rows, prompt 70 tokens + 32 already decoded):
- ``hf forward``: the model's own forward on a growing ``DynamicCache`` (what the engine ran before),
- ``lean step``: ``LeanDecoder.step`` on a preallocated cache (oneDNN's packed matmuls: logits to fp32 rounding),
- ``lean step, exact``: the same with ``exact=True`` (the model's own matmuls: logits bit for bit),
- ``matmuls only``: the step's ``F.linear`` calls alone on the same shapes (the BLAS matmuls the exact step pays),
- ``cache growth``: the ``torch.cat`` of every layer's K and V that a ``DynamicCache`` does each step,
- ``sampling``: ``sample_with_logprobs`` for the batch, and the old per-row ``torch.rand(...).item()`` draws.
Variants interleave; medians of ``--repeats`` rounds of 20 steps each, in microseconds of this
process's CPU time (``time.process_time``: on a shared machine, other jobs' load does not inflate it;
run with OMP_NUM_THREADS=1 so CPU time is the work itself, not other threads spinning).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.nn.functional as F
from curve_models import SIZES
from transformers import AutoModelForCausalLM

from ludic.kernels.cpu.lean_decoder import LeanDecoder, StaticKVCache
from ludic.kernels.cpu.sampling_kernel import sample_with_logprobs
from ludic.testing import tiny_model_path

ROWS, PROMPT, DONE = 32, 70, 32


def _setup(model):
    ids = torch.randint(3, 250, (ROWS, PROMPT + DONE))
    out = model(input_ids=ids, use_cache=True)
    return out.past_key_values, ids


def _timers(model) -> dict[str, callable]:
    cache, _ = _setup(model)
    width = PROMPT + DONE
    mask = torch.ones(ROWS, width + 1, dtype=torch.long)
    position = torch.full((ROWS, 1), width)
    token = torch.randint(3, 250, (ROWS, 1))
    lean, exact = LeanDecoder(model), LeanDecoder(model, exact=True)
    static = StaticKVCache.from_prefill(cache, torch.arange(ROWS), mask[:, :width], width + 128)
    cos, sin = lean.rope_tables(width + 128, torch.float32)
    weights, exact_weights = lean.bind(ROWS), exact.bind(ROWS)
    layers = [(a.weight, a.bias) for a in model.modules() if isinstance(a, torch.nn.Linear)]
    x = torch.randn(ROWS, 1, model.config.hidden_size)
    inter = torch.randn(ROWS, 1, model.config.intermediate_size)
    keys = [entry.keys for entry in cache.layers]
    logits = torch.randn(ROWS, model.config.vocab_size)
    params = torch.tensor([[1.0, 1.0]] * ROWS)
    gens = [torch.Generator().manual_seed(i) for i in range(ROWS)]

    def hf() -> None:
        model(input_ids=token, attention_mask=mask, position_ids=position, past_key_values=cache, use_cache=True)
        cache.crop(-1)  # undo the step's growth so every call sees the same length

    def matmuls() -> None:
        for w, b in layers:
            F.linear(inter if w.shape[1] == inter.shape[-1] else x, w, b)

    def growth() -> None:
        for k in keys:  # K and V of each layer, one new column each
            torch.cat([k, k[:, :, :1]], dim=-2)
            torch.cat([k, k[:, :, :1]], dim=-2)

    return {
        "hf forward": hf,
        "lean step": lambda: lean.step(weights, token[:, 0], cos[position[:, 0]], sin[position[:, 0]], static, width),
        "lean step, exact": lambda: exact.step(exact_weights, token[:, 0], cos[position[:, 0]], sin[position[:, 0]], static, width),
        "matmuls only": matmuls,
        "cache growth": growth,
        "sampling (batch)": lambda: sample_with_logprobs(logits, params, torch.rand(ROWS)),
        "per-row draws": lambda: [torch.rand(1, generator=g).item() for g in gens],
    }


def _time(fn, steps: int) -> float:
    start = time.process_time()
    for _ in range(steps):
        fn()
    return (time.process_time() - start) / steps * 1e6


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{ROWS} rows, {PROMPT + DONE} cached tokens, {torch.get_num_threads()} threads, medians of {args.repeats}")
    for size in args.sizes:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path(**SIZES[size]))).eval()
        timers = _timers(model)
        for fn in timers.values():
            _time(fn, 3)
        runs: dict[str, list[float]] = {name: [] for name in timers}
        for _ in range(args.repeats):
            for name, fn in timers.items():
                runs[name].append(_time(fn, 20))
        med = {name: statistics.median(v) for name, v in runs.items()}
        print(f"\n{size}: us per step (share of the hf forward)")
        for name, value in med.items():
            print(f"  {name:<18}{value:>10.0f}  ({value / med['hf forward']:.2f})")


if __name__ == "__main__":
    main()
