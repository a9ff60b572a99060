"""The engine's per-step draw at a real vocabulary: the two-level inverse CDF against one cumsum.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_sampling.py [--rows 32 --vocab 49152 151936 --repeats 9]

Per vocabulary, one decoding step's draw for ``--rows`` rows at temperature 1 (GRPO's usual), no nucleus:
- ``library``: ``sample_with_logprobs`` (one softmax pass; block sums then a cumsum inside the drawn block;
  the token's log-prob as log p),
- ``one cumsum``: the draw as it was before (``log_softmax``, ``exp``, one cumsum over the vocabulary, the
  token's log-prob gathered from ``log_softmax``), kept here as the baseline.
Variants interleave, each on fresh logits of the same shape every call (as a decoding step's are); medians of
``--repeats`` rounds of 20 draws, wall time per draw. Also printed: how many of 20,000 draws pick the same token
both ways (they may differ only within fp32 rounding of a token boundary), how many pick the token of the
inverse CDF computed in float64, and the largest log-prob difference.
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial

import torch
from timing import timed

from ludic.kernels.cpu.sampling_kernel import SamplingPlan, sample_with_logprobs


def one_cumsum(logits: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    cdf = torch.cumsum(log_probs.exp(), dim=-1)
    pick = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1)).clamp(max=cdf.shape[-1] - 1)
    return pick.squeeze(-1), log_probs.gather(-1, pick).squeeze(-1)


def definition(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The inverse CDF in float64: the token both variants stand for."""
    cdf = torch.softmax(logits.double(), dim=-1).cumsum(-1)
    return torch.searchsorted(cdf, (uniforms.double() * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)


def draw_each(fn, logits: list[torch.Tensor], uniforms: torch.Tensor) -> None:
    for x in logits:
        fn(x, uniforms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    params = torch.tensor([[1.0, 1.0]]).expand(args.rows, -1)
    plan = SamplingPlan.of([(1.0, 1.0)])
    variants = {"library": lambda x, u: sample_with_logprobs(x, params, u, plan), "one cumsum": one_cumsum}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rows} rows")
    for vocab in args.vocab:
        gen = torch.Generator().manual_seed(vocab)
        logits = [torch.randn(args.rows, vocab, generator=gen) * 4 for _ in range(20)]
        uniforms = torch.rand(args.rows, generator=gen)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.repeats + 1):  # the first round warms up
            for name, fn in variants.items():
                times[name].append(timed(partial(draw_each, fn, logits, uniforms), "cpu") / len(logits))
        same, exact_lib, exact_old, worst, draws = 0, 0, 0, 0.0, 0
        while draws < 20_000:
            x, u = torch.randn(args.rows, vocab, generator=gen) * 4, torch.rand(args.rows, generator=gen)
            (a, la), (b, lb) = variants["library"](x, u), one_cumsum(x, u)
            want = definition(x, u)
            same, exact_lib, exact_old = same + int((a == b).sum()), exact_lib + int((a == want).sum()), exact_old + int((b == want).sum())
            worst = max(worst, float((la - lb)[a == b].abs().max()))
            draws += args.rows
        lib, old = (statistics.median(times[k][1:]) * 1e3 for k in ("library", "one cumsum"))
        print(f"vocab {vocab:>7,}: library {lib:.2f} ms, one cumsum {old:.2f} ms per draw: {old / lib:.2f}x; "
              f"same token in {same:,} of {draws:,} draws; the float64 definition's token: library {exact_lib:,}, "
              f"one cumsum {exact_old:,}; log-prob difference at most {worst:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
