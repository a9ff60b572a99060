"""The decoding step's attention over shared prompts: Ludic's kernel against the two SDPA calls, side by side.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_decode_attention.py [--rounds 5] [--engine-rounds 6] [MODEL]

Two parts, each pair of variants interleaved in every round, medians:

- **attention**: ``SharedPrefixKVCache.attend`` for every layer of one decoding step at SmolLM2-135M's
  shapes (30 layers, 9 query heads on 3 KV heads of 64 dims; 32 rows over 4 prompts of 40 columns, one
  left-padded; 64 new tokens), at three suffix lengths, ``native=True`` (``decode_attention.py``: one call
  a layer) against ``native=False`` (two flash-attention calls and their merge); the two outputs are
  checked equal to 1e-5 first.
- **engine** (with a model folder; default the catalogue's SmolLM2-135M-Instruct, skipped when it is not
  there): the embedded engine generating 32 replies of up to 64 tokens (4 prompts x 8, temperature 1),
  the kernel on and off in the same process (``BatchGenerator.native_attention``); tokens per second over
  all rounds, since the two sides sample replies of other lengths once their fp32 sums differ.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import types
from pathlib import Path

import torch

from ludic.kernels.cpu import decode_attention
from ludic.kernels.cpu.shared_prefix_cache import SharedPrefixKVCache

LAYERS, PROMPTS, KV_HEADS, GROUPS, DIM, WIDTH, NEW, ROWS = 30, 4, 3, 3, 64, 40, 64, 32


def _caches() -> tuple[dict[bool, SharedPrefixKVCache], torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    shape = (PROMPTS, KV_HEADS, WIDTH, DIM)
    layers = [types.SimpleNamespace(keys=torch.randn(shape), values=torch.randn(shape)) for _ in range(LAYERS)]
    mask = torch.ones(PROMPTS, WIDTH, dtype=torch.long)
    mask[1, :5] = 0
    index = torch.arange(ROWS) % PROMPTS
    caches = {
        native: SharedPrefixKVCache(types.SimpleNamespace(layers=layers), index, mask, NEW, native=native, groups=GROUPS)
        for native in (True, False)
    }
    q = torch.randn(LAYERS, ROWS, KV_HEADS * GROUPS, DIM)
    return caches, q, torch.randn(LAYERS, ROWS, KV_HEADS, DIM), torch.randn(LAYERS, ROWS, KV_HEADS, DIM)


def attention_part(rounds: int) -> dict[str, dict[str, float]]:
    caches, q, k, v = _caches()

    def step(cache: SharedPrefixKVCache, column: int) -> list[torch.Tensor]:
        cache.begin(WIDTH + column)
        return [cache.attend(layer, q[layer], k[layer], v[layer], DIM**-0.5) for layer in range(LAYERS)]

    for column in range(NEW):  # fill both suffixes; the outputs must agree
        ours, sdpa = step(caches[True], column), step(caches[False], column)
        worst = max((a - b).abs().max().item() for a, b in zip(ours, sdpa, strict=True))
        assert worst < 1e-5, f"column {column}: the kernel and SDPA differ by {worst}"
    results = {}
    for column in (8, 32, 63):
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for native in (True, False):
                samples = []
                for _ in range(20):
                    t0 = time.perf_counter()
                    step(caches[native], column)
                    samples.append(time.perf_counter() - t0)
                times[native].append(statistics.median(samples))
        ours, sdpa = (1e3 * statistics.median(times[n]) for n in (True, False))
        results[f"{WIDTH + column + 1} keys"] = {"kernel_ms": round(ours, 2), "sdpa_ms": round(sdpa, 2),
                                                 "speedup": round(sdpa / ours, 2)}  # fmt: skip
        print(f"attention, {LAYERS} layers, {WIDTH + column + 1} keys: kernel {ours:.2f} ms, two SDPA calls "
              f"{sdpa:.2f} ms ({sdpa / ours:.2f}x)", flush=True)  # fmt: skip
    return results


def engine_part(model: str, rounds: int) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_engine_speed import _engine, _requests

    from ludic.inference import TransformersChatClient

    client = TransformersChatClient(model, generate_in_thread=False)
    generator = client._generator
    asyncio.run(_engine(client, _requests(ROWS, 4, 0)))  # warm-up
    seconds: dict[bool, float] = {True: 0.0, False: 0.0}
    tokens: dict[bool, int] = {True: 0, False: 0}
    for r in range(rounds):
        for native in (True, False) if r % 2 == 0 else (False, True):
            generator.native_attention = native
            t0 = time.perf_counter()
            tokens[native] += asyncio.run(_engine(client, _requests(ROWS, NEW, r + 1)))
            seconds[native] += time.perf_counter() - t0
    rate = {n: tokens[n] / seconds[n] for n in (True, False)}
    print(f"engine, {ROWS} x {NEW} tokens, {rounds} rounds: kernel {rate[True]:.1f} tok/s, two SDPA calls "
          f"{rate[False]:.1f} tok/s ({rate[True] / rate[False]:.2f}x)", flush=True)  # fmt: skip
    return {"kernel_tok_s": round(rate[True], 1), "sdpa_tok_s": round(rate[False], 1),
            "speedup": round(rate[True] / rate[False], 3)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="transformers folder (default: the catalogue's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engine-rounds", type=int, default=6, help="0: skip the engine part")
    args = parser.parse_args()
    if not decode_attention.available():
        sys.exit(f"the decoding attention kernel cannot run here: {decode_attention.unavailable_reason()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    attention_part(args.rounds)
    if args.engine_rounds > 0:
        from ludic.models import prepared_path

        model = args.model or str(prepared_path("smollm2-135m-instruct"))
        if Path(model).is_dir():
            engine_part(model, args.engine_rounds)
        else:
            print(f"engine part skipped: no model folder at {model} (`ludic models pull smollm2-135m-instruct`)")


if __name__ == "__main__":
    main()
