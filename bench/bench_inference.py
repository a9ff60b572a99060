"""Embedded engine throughput: 32 concurrent requests through TransformersChatClient, side by side with
one batched ``model.generate`` call on the same prompts and with the same requests served one at a time.

Goals (issue 2): client >= 0.8x batched generate's tokens/s, and >= 5x the one-at-a-time client.
The client runs the model on a worker thread, so ``model.generate`` runs on one too: on a busy
machine, OpenMP in the main thread behaved very differently (up to 50x slower) from a worker thread.
Each variant reports its best of ``--repeats`` interleaved runs: on a shared machine the fastest run
is the least disturbed one.
Run: ``.venv/bin/python bench/bench_inference.py [--requests 32 --new-tokens 32 --repeats 3]``.
On a GPU: ``--device cuda --hidden-size 1024 --layers 16`` (a ~200M-parameter Qwen2, random init).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch

from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
from ludic.testing import tiny_model_path


def _requests(n: int, new_tokens: int) -> list[ChatCompletionRequest]:
    return [
        ChatCompletionRequest(
            model="tiny",
            messages=[{"role": "user", "content": f"Write a word with the letter {chr(97 + i % 26)} #{i}"}],
            sampling=SamplingConfig(temperature=1.0, max_tokens=new_tokens, seed=i),
        )
        for i in range(n)
    ]


async def _client_concurrent(client: TransformersChatClient, reqs: list[ChatCompletionRequest]) -> int:
    results = await asyncio.gather(*[client.complete(r) for r in reqs])
    return sum(len(r.completion_token_ids) for r, _ in results)


async def _client_sequential(client: TransformersChatClient, reqs: list[ChatCompletionRequest]) -> int:
    total = 0
    for r in reqs:
        response, _ = await client.complete(r)
        total += len(response.completion_token_ids)
    return total


@torch.inference_mode()
def _hf_generate(client: TransformersChatClient, reqs: list[ChatCompletionRequest], new_tokens: int) -> int:
    prompts = [client.prompt_ids_for(r) for r in reqs]
    width = max(map(len, prompts))
    pad = client.tokenizer.pad_token_id
    device = client.device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    starts = torch.tensor([width - len(p) for p in prompts], device=device)
    mask = (torch.arange(width, device=device)[None, :] >= starts[:, None]).long()
    out = client.model.generate(
        input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=new_tokens, pad_token_id=pad
    )
    new = out[:, width:]
    eos = client.tokenizer.eos_token_id
    # count generated tokens up to and including the first EOS of each row
    total = 0
    for row in new.tolist():
        total += row.index(eos) + 1 if eos in row else len(row)
    return total


def _in_worker_thread(fn, *args):
    """Run ``fn`` on a worker thread, like the client's own generation loop."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args).result()


def _timed(fn) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="torch device for the model (cpu, cuda)")
    parser.add_argument("--hidden-size", type=int, default=128, help="width of the random-init Qwen2")
    parser.add_argument("--layers", type=int, default=4, help="depth of the random-init Qwen2")
    args = parser.parse_args()
    torch.manual_seed(0)
    path = tiny_model_path(
        hidden_size=args.hidden_size, num_layers=args.layers, intermediate_size=3 * args.hidden_size
    )
    client = TransformersChatClient(path, device=args.device)
    params = sum(p.numel() for p in client.model.parameters()) / 1e6
    reqs = _requests(args.requests, args.new_tokens)
    runs = {
        "client, concurrent": lambda: asyncio.run(_client_concurrent(client, reqs)),
        "model.generate, one batch": lambda: _in_worker_thread(_hf_generate, client, reqs, args.new_tokens),
        "client, one at a time": lambda: asyncio.run(_client_sequential(client, reqs)),
    }
    for fn in runs.values():  # warm-up
        fn()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):  # interleaved, so machine noise hits every variant alike
        for name, fn in runs.items():
            seconds, tokens = _timed(fn)
            rates[name].append(tokens / seconds)
    best = {name: max(v) for name, v in rates.items()}
    print(
        f"{args.requests} requests x {args.new_tokens} new tokens, Qwen2 ({params:.1f}M params), "
        f"{args.device}, {torch.get_num_threads()} threads, best of {args.repeats}"
    )
    print(f"{'variant':<28}{'tokens/s (best)':>20}")
    for name, rate in best.items():
        print(f"{name:<28}{rate:>20.0f}")
    vs_generate = best["client, concurrent"] / best["model.generate, one batch"]
    vs_sequential = best["client, concurrent"] / best["client, one at a time"]
    print(f"ratio client/generate:   {vs_generate:.2f}x (goal >= 0.8x)")
    print(f"ratio client/sequential: {vs_sequential:.2f}x (goal >= 5x)")


if __name__ == "__main__":
    main()
