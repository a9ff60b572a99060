"""The embedded engine vs one batched ``model.generate``: 32 rows x 128 new tokens, same model, same sampling.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_engine_speed.py [--sizes 0.8M 6M 25M --repeats 5 --context 0]

Per model size (the sizes ``bench_vs_trl_curve.py`` trains), five variants run interleaved on the
same 32 prompts (4 distinct prompts x 8, a GRPO-shaped batch), temperature 1, top_p 1:
- ``engine``: 32 concurrent ``TransformersChatClient.complete`` calls (the lean decoding loop),
- ``engine, no prompt sharing``: the same, each row attending over its own copy of the prompt's K/V
  (``share_prefix=False``: the lean loop before cascade attention),
- ``engine, exact``: the same with ``exact=True`` (no prompt sharing, the model's own matmuls instead of
  oneDNN's packed ones: logits bit-identical to HF's),
- ``engine, hf decode``: the same client decoding through the model's own forward (``lean=False``),
- ``model.generate``: one batched call (``do_sample=True``, no top-k), on the same thread.
Each reports tokens/s (tokens up to and including each row's EOS) by wall clock and by this process's
CPU time (``time.process_time``, which other jobs on a shared machine do not inflate; with
OMP_NUM_THREADS=1 it is the work itself); ratios are medians over ``--repeats`` interleaved rounds.
Replies of the random-init models run to the cap unless EOS is drawn (about 4 in 10 rows draw it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from curve_models import SIZES

from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
from ludic.inference.embedded._generation import BatchGenerator
from ludic.testing import tiny_model_path


def _requests(rows: int, new_tokens: int, seed: int, context: int = 0) -> list[ChatCompletionRequest]:
    text = "".join(chr(97 + (7 * j) % 26) for j in range(context))  # one token per byte
    return [
        ChatCompletionRequest(
            model="tiny",
            messages=[{"role": "user", "content": f"{text}Write a word containing the letter {chr(97 + i % 4)}."}],
            sampling=SamplingConfig(temperature=1.0, max_tokens=new_tokens, seed=seed * 1000 + i),
        )
        for i in range(rows)
    ]


async def _engine(client: TransformersChatClient, reqs: list[ChatCompletionRequest]) -> int:
    results = await asyncio.gather(*[client.complete(r) for r in reqs])
    return sum(len(r.completion_token_ids) for r, _ in results)


@torch.inference_mode()
def _hf_generate(client: TransformersChatClient, reqs: list[ChatCompletionRequest], new_tokens: int) -> int:
    prompts = [client.prompt_ids_for(r) for r in reqs]
    width = max(map(len, prompts))
    pad = client.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = (ids != pad).long()
    out = client.model.generate(
        input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        max_new_tokens=new_tokens, pad_token_id=pad,
    )  # fmt: skip
    eos = client.tokenizer.eos_token_id
    return sum(row.index(eos) + 1 if eos in row else len(row) for row in out[:, width:].tolist())


def run_size(size: str, rows: int, new_tokens: int, repeats: int, context: int) -> dict[str, float]:
    path = tiny_model_path(**SIZES[size])
    client = TransformersChatClient(path, generate_in_thread=False)
    gen = client._generator
    fanned_client = TransformersChatClient(path, generate_in_thread=False)
    fanned_client.model = client.model  # the very same weights
    fanned_client._generator = BatchGenerator(client.model, gen.tokenizer, gen.eos_ids, gen.pad_id, gen.device, share_prefix=False)
    exact_client = TransformersChatClient(path, generate_in_thread=False)
    exact_client.model = client.model
    exact_client._generator = BatchGenerator(client.model, gen.tokenizer, gen.eos_ids, gen.pad_id, gen.device, exact=True)
    hf_client = TransformersChatClient(path, generate_in_thread=False)
    hf_client.model = client.model
    hf_client._generator = BatchGenerator(client.model, gen.tokenizer, gen.eos_ids, gen.pad_id, gen.device, lean=False)
    variants = {
        "engine": lambda r: asyncio.run(_engine(client, _requests(rows, new_tokens, r, context))),
        "engine, no prompt sharing": lambda r: asyncio.run(_engine(fanned_client, _requests(rows, new_tokens, r, context))),
        "engine, exact": lambda r: asyncio.run(_engine(exact_client, _requests(rows, new_tokens, r, context))),
        "engine, hf decode": lambda r: asyncio.run(_engine(hf_client, _requests(rows, new_tokens, r, context))),
        "model.generate": lambda r: _hf_generate(client, _requests(rows, new_tokens, r, context), new_tokens),
    }
    for fn in variants.values():  # warm-up
        fn(0)
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(repeats):
        for name, fn in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            tokens = fn(r + 1)
            wall[name].append(tokens / (time.perf_counter() - start))
            cpu[name].append(tokens / (time.process_time() - start_cpu))
    params = sum(p.numel() for p in client.model.parameters()) / 1e6
    print(f"\n{size} ({params:.2f}M params): tokens/s, median of {repeats} interleaved rounds")
    print(f"  {'variant':<27}{'wall':>8}{'cpu':>8}")
    for name in variants:
        print(f"  {name:<27}{statistics.median(wall[name]):>8.0f}{statistics.median(cpu[name]):>8.0f}")
    out = {}
    for clock, rates in (("wall", wall), ("cpu", cpu)):
        pairs = (("generate", "model.generate"), ("hf_decode", "engine, hf decode"), ("fanned", "engine, no prompt sharing"),
                 ("exact", "engine, exact"))  # fmt: skip
        for key, other in pairs:
            ratios = [e / g for e, g in zip(rates["engine"], rates[other], strict=True)]
            out[f"{clock}_vs_{key}"] = statistics.median(ratios)
        print(f"  engine / model.generate by {clock} time: {out[f'{clock}_vs_generate']:.2f}x "
              f"(rounds: {', '.join(f'{e / g:.2f}' for e, g in zip(rates['engine'], rates['model.generate']))})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--context", type=int, default=0, help="extra prompt tokens before the task (a long prompt)")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{args.rows} rows x {args.new_tokens} new tokens, {args.context} extra prompt tokens, "
          f"{torch.get_num_threads()} threads, fp32, CPU")  # fmt: skip
    summary = {size: run_size(size, args.rows, args.new_tokens, args.repeats, args.context) for size in args.sizes}
    print("\nengine / model.generate, / hf decode, / no prompt sharing, / exact (goal >= 1.5x generate)")
    print("size     by wall     by cpu   vs hf decode (wall, cpu)   vs no sharing (wall, cpu)   vs exact (wall, cpu)")
    for size, s in summary.items():
        print(f"{size:<7}{s['wall_vs_generate']:>8.2f}x{s['cpu_vs_generate']:>10.2f}x"
              f"{s['wall_vs_hf_decode']:>10.2f}x{s['cpu_vs_hf_decode']:>7.2f}x"
              f"{s['wall_vs_fanned']:>14.2f}x{s['cpu_vs_fanned']:>7.2f}x"
              f"{s['wall_vs_exact']:>14.2f}x{s['cpu_vs_exact']:>7.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
