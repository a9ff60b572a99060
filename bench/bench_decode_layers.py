"""A decoding step through every layer in one native call against the lean decoder's Python loop, side by side.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_decode_layers.py [--rounds 7] [--engine-rounds 6] [MODEL]

Two parts on a model folder (default the catalogue's SmolLM2-135M-Instruct), each pair of variants
interleaved in every round, medians:

- **step**: ``LeanDecoder.step`` on the shared-prefix cache (4 prompts of 40 tokens, 32 decoded), at 32, 16,
  8 and 4 live rows, with ``decode_layers`` (``layers=True``) and without (the Python loop over the layers,
  the same matmul and attention kernels); the logits are checked equal to fp32 rounding first.
- **engine**: the embedded engine generating 32 replies of up to 64 tokens (4 prompts x 8, temperature 1),
  the kernel on and off in the same process (``LeanDecoder.native_layers``); tokens per second over all
  rounds, since the two sides sample replies of other lengths once their fp32 sums differ.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import torch

from ludic.inference.embedded._generation import CACHE
from ludic.kernels.cpu import decode_layers
from ludic.kernels.cpu.lean_decoder import LeanDecoder
from ludic.kernels.cpu.shared_prefix_cache import SharedPrefixKVCache

PROMPTS, WIDTH, DONE, NEW = 4, 40, 32, 64


@torch.inference_mode()
def step_part(model: torch.nn.Module, rounds: int) -> dict[str, dict[str, float]]:
    torch.manual_seed(0)
    out = model(input_ids=torch.randint(3, 4000, (PROMPTS, WIDTH)), use_cache=True)
    prefill = getattr(out, CACHE)  # this transformers' name for the returned cache
    decoders = {True: LeanDecoder(model), False: LeanDecoder(model, layers=False)}
    weights = decoders[False].bind(32)
    groups = decoders[False].heads // decoders[False].kv_heads
    cos, sin = decoders[False].rope_tables(WIDTH + NEW, torch.float32)
    results = {}
    for rows in (32, 16, 8, 4):
        index = torch.arange(rows) % PROMPTS
        mask = torch.ones(PROMPTS, WIDTH, dtype=torch.long)
        caches = {k: SharedPrefixKVCache(prefill, index, mask, NEW, native=True, groups=groups) for k in decoders}
        tokens, position = torch.randint(3, 4000, (rows,)), torch.full((rows,), WIDTH + DONE)

        def step(native: bool, tokens=tokens, position=position, caches=caches) -> torch.Tensor:
            return decoders[native].step(weights, tokens, cos[position], sin[position], caches[native], WIDTH + DONE)

        ours, loop = step(True), step(False)
        worst = ((ours - loop).abs().max() / loop.abs().max()).item()
        assert worst < 1e-5, f"{rows} rows: the kernel's logits differ from the loop's by {worst} (relative)"
        assert caches[True].layer_table is not None, "the kernel did not take this model's layers"
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for native in (True, False):
                samples = []
                for _ in range(10):
                    t0 = time.perf_counter()
                    step(native)
                    samples.append(time.perf_counter() - t0)
                times[native].append(statistics.median(samples))
        ours, loop = (1e3 * statistics.median(times[n]) for n in (True, False))
        results[f"{rows} rows"] = {"kernel_ms": round(ours, 2), "loop_ms": round(loop, 2), "speedup": round(loop / ours, 3)}
        print(f"step, {rows} rows: one call {ours:.2f} ms, Python loop {loop:.2f} ms ({loop / ours:.3f}x; "
              f"logits within {worst:.1e} of their largest)", flush=True)  # fmt: skip
    return results


def engine_part(model: str, rounds: int) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_engine_speed import _engine, _requests

    from ludic.inference import TransformersChatClient

    client = TransformersChatClient(model, generate_in_thread=False)
    lean = client._generator.lean
    assert lean is not None and lean.native_layers, "the engine does not decode through decode_layers here"
    asyncio.run(_engine(client, _requests(32, 4, 0)))  # warm-up
    seconds: dict[bool, float] = {True: 0.0, False: 0.0}
    tokens: dict[bool, int] = {True: 0, False: 0}
    for r in range(rounds):
        for native in (True, False) if r % 2 == 0 else (False, True):
            lean.native_layers = native
            t0 = time.perf_counter()
            tokens[native] += asyncio.run(_engine(client, _requests(32, NEW, r + 1)))
            seconds[native] += time.perf_counter() - t0
    rate = {n: tokens[n] / seconds[n] for n in (True, False)}
    print(f"engine, 32 x {NEW} tokens, {rounds} rounds: one call {rate[True]:.1f} tok/s, Python loop "
          f"{rate[False]:.1f} tok/s ({rate[True] / rate[False]:.3f}x)", flush=True)  # fmt: skip
    return {"kernel_tok_s": round(rate[True], 1), "loop_tok_s": round(rate[False], 1),
            "speedup": round(rate[True] / rate[False], 3)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="transformers folder (default: the catalogue's)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--engine-rounds", type=int, default=6, help="0: skip the engine part")
    args = parser.parse_args()
    if not decode_layers.available():
        sys.exit(f"the decoding layers kernel cannot run here: {decode_layers.unavailable_reason()}")
    from transformers import AutoModelForCausalLM

    from ludic.models import prepared_path

    folder = args.model or str(prepared_path("smollm2-135m-instruct"))
    if not Path(folder).is_dir():
        sys.exit(f"no model folder at {folder} (`ludic models pull smollm2-135m-instruct`)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {folder}")
    step_part(AutoModelForCausalLM.from_pretrained(folder).eval(), args.rounds)
    if args.engine_rounds > 0:
        engine_part(folder, args.engine_rounds)


if __name__ == "__main__":
    main()
