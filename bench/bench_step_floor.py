"""How fast Ludic's step in a TRL-curve cell could be on this CPU: its matmuls alone, at this core's speed.

A GRPO step of ``bench_vs_trl_curve.py`` must run a fixed set of matrix products whatever the code
around them does: the decoding's linear layers (32 rows, once per reply token) and the training's
forward, grad-input and grad-weight products over the step's positions (the group's prompt once per
prompt, as Ludic's prefix sharing lays it out). This script times exactly those products in
isolation, each at the faster of torch's default BLAS (MKL) and oneDNN, interleaved round by round,
and sums them: the **matmul floor** of the cell. Attention, norms, sampling, the optimizer and the
Python around them come on top.

With ``--curve results.json`` (written by ``bench_vs_trl_curve.py``) it counts the tokens those steps
really sampled and sets each floor beside them: Ludic's step, TRL's, and the lead Ludic would have if all
its other work cost nothing (TRL / floor); ``bench_vs_trl_curve.py --floor`` does the same in one run. Where that bound is near 2x, a 2x lead would need the rest of the step (attention over
the KV cache and the packed rows, elementwise work, the loop) to all but vanish.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_step_floor.py --curve runs/bench_vs_trl_curve/results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_train_matmuls import products
from curve_models import SIZES

from ludic.kernels.cpu.onednn_linear import onednn_available

PROMPTS, GROUP, PROMPT_LEN, VOCAB = 4, 8, 36, 259  # the curve's task: 4 prompts x 8 replies, 36-token prompts


@dataclass(frozen=True)
class Linear:
    """One weight's product shape: ``in_features -> out_features``, ``count`` times per model."""

    in_features: int
    out_features: int
    count: int


def training_linears(
    hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int, intermediate_size: int
) -> list[Linear]:
    """Every linear layer of a tiny Qwen2 (projections apart, as the training forward runs them)."""
    kv = hidden_size // num_heads * num_kv_heads
    per_layer = [
        (hidden_size, hidden_size), (hidden_size, kv), (hidden_size, kv), (hidden_size, hidden_size),
        (hidden_size, intermediate_size), (hidden_size, intermediate_size), (intermediate_size, hidden_size),
    ]  # fmt: skip
    shapes: dict[tuple[int, int], int] = {}
    for pair in per_layer:
        shapes[pair] = shapes.get(pair, 0) + num_layers
    return [Linear(i, o, n) for (i, o), n in shapes.items()] + [Linear(hidden_size, VOCAB, 1)]


def decoding_linears(
    hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int, intermediate_size: int
) -> list[Linear]:
    """The decoding step's matmuls, q/k/v and gate/up fused as the lean decoder runs them."""
    kv = hidden_size // num_heads * num_kv_heads
    return [
        Linear(hidden_size, hidden_size + 2 * kv, num_layers), Linear(hidden_size, hidden_size, num_layers),
        Linear(hidden_size, 2 * intermediate_size, num_layers), Linear(intermediate_size, hidden_size, num_layers),
        Linear(hidden_size, VOCAB, 1),
    ]  # fmt: skip


def fastest(variants: list[Callable[[], object]], repeats: int) -> float:
    """Median seconds of the fastest variant, the variants interleaved in every round."""
    times: list[list[float]] = [[] for _ in variants]
    for fn in variants:
        fn()  # warm-up: oneDNN builds its primitive, MKL its buffers
    for _ in range(repeats):
        for i, fn in enumerate(variants):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return min(statistics.median(t) for t in times)


def fastest_products(linear: Linear, rows: int, repeats: int, names: tuple[str, ...]) -> float:
    """Seconds of the named products of one linear over ``rows`` positions (``bench_train_matmuls.products``:
    forward, grad input, grad weight), each at the faster of MKL and oneDNN where oneDNN runs."""
    x, w = torch.randn(rows, linear.in_features), torch.randn(linear.out_features, linear.in_features)
    pairs = products(x, w, torch.randn(rows, linear.out_features))
    variants = slice(None) if onednn_available() else slice(1)
    return sum(fastest(list(pairs[name][variants]), repeats) for name in names)


def training_seconds(linear: Linear, rows: int, repeats: int) -> float:
    """Forward + grad input + grad weight of one linear over ``rows`` positions."""
    return fastest_products(linear, rows, repeats, ("forward", "grad input", "grad weight"))


def forward_seconds(linear: Linear, rows: int, repeats: int) -> float:
    """The prefill's forward product of one linear over ``rows`` positions."""
    return fastest_products(linear, rows, repeats, ("forward",))


def decoding_seconds(linear: Linear, rows: int, repeats: int) -> float:
    """One decoding step's product for ``rows`` rows, MKL or oneDNN's packed weight, the faster."""
    x, w = torch.randn(rows, linear.in_features), torch.randn(linear.out_features, linear.in_features)
    variants: list[Callable[[], object]] = [lambda: F.linear(x, w)]
    if onednn_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
        variants.append(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
    return fastest(variants, repeats * 4)


def cell_floor(
    size: str, reply: int, repeats: int, *, tokens: float | None = None, prompt_len: float = PROMPT_LEN
) -> dict[str, float]:
    """The matmul floor of one cell: decoding (32 rows x ``reply`` steps, or the ``tokens`` the step
    really sampled when rows stop early, plus the prompts' prefill) and training (the step's positions:
    each prompt once, then every sampled token)."""
    rows = PROMPTS * GROUP
    sampled = rows * reply if tokens is None else tokens
    prompt_rows = round(PROMPTS * prompt_len)
    train_rows = prompt_rows + round(sampled)
    train = sum(
        training_seconds(lin, train_rows, repeats) * lin.count for lin in training_linears(**SIZES[size])
    )
    full_decode = reply * sum(
        decoding_seconds(lin, rows, repeats) * lin.count for lin in decoding_linears(**SIZES[size])
    )
    decode = full_decode * sampled / (rows * reply)  # a finished row leaves the batch: row-steps scale it
    prefill = sum(
        forward_seconds(lin, prompt_rows, repeats) * lin.count for lin in training_linears(**SIZES[size])
    )
    return {"training": train, "generation": decode + prefill, "floor": train + decode + prefill}


def table(floors: dict[tuple[str, int], dict[str, float]], curve: list[dict] | None) -> str:
    by_cell = {(c["size"], c["reply_tokens"]): c for c in curve or []}
    lines = [
        "| model | reply tokens | matmul floor s (generation / training) | Ludic s/step (generation / training) | TRL s/step | TRL / floor | TRL / Ludic |",
        "|---|---|---|---|---|---|---|",
    ]
    for (size, reply), f in floors.items():
        c = by_cell.get((size, reply))
        floor = f"{f['floor']:.3f} ({f['generation']:.3f} / {f['training']:.3f})"
        if c is None:
            lines.append(f"| {size} | {reply} | {floor} | | | | |")
            continue
        lu, trl = c["ludic"], c["trl"]["s_per_step"]
        lines.append(
            f"| {size} | {reply} | {floor} | {lu['s_per_step']:.3f} ({lu['generation']:.3f} / {lu['training']:.3f}) | "
            f"{trl:.3f} | {trl / f['floor']:.2f}x | {trl / lu['s_per_step']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--replies", nargs="+", type=int, default=[4, 32, 128])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--curve", type=Path, help="results.json of bench_vs_trl_curve.py, to set the floors beside"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    curve = json.loads(args.curve.read_text()) if args.curve else None
    measured = {(c["size"], c["reply_tokens"]): c["ludic"] for c in curve or []}
    floors = {}
    for size in args.sizes:
        for reply in args.replies:
            ludic = measured.get((size, reply), {})  # the tokens the curve's steps sampled, where it has them
            floors[(size, reply)] = cell_floor(
                size,
                reply,
                args.repeats,
                tokens=ludic.get("tokens"),
                prompt_len=ludic.get("prompt_tokens", PROMPT_LEN),
            )
            print(json.dumps({"size": size, "reply_tokens": reply, **floors[(size, reply)]}), flush=True)
    print(table(floors, curve))


if __name__ == "__main__":
    main()
