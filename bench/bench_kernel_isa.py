"""Ludic's C++ kernels built for one instruction set against every kernel on its PyTorch path, side by side.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_kernel_isa.py [--isa avx2] [--rounds 2] [--steps 3] [MODEL]

On a model folder (default the catalogue's SmolLM2-135M-Instruct), each variant in its own processes, the two
interleaved in every round (``$LUDIC_KERNELS_ISA``: the named set, or ``off``), medians:

- **engine**: the embedded engine generating 32 replies of up to 64 tokens (4 prompts x 8, temperature 1), 3
  rounds a process after a warm-up: tokens per second over the rounds (the two sides' replies differ in
  length once their fp32 sums do);
- **step**: ``bench_real_model.py``'s GRPO step on Ludic (4 prompts x 8 samples x 64 tokens, its first step
  warm-up): the step, its generation and its forward-backward, seconds.

What it answers: whether the kernels pay on a CPU, so ``auto`` can be trusted there (an AVX2 laptop's, say,
where the AVX-512 figures in docs/benchmarks.md say nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
REAL_MODEL = HERE / "bench_real_model.py"


def engine_worker(model: str | None) -> dict:
    """This process's engine: 32 x 64 tokens, 3 timed rounds after a warm-up."""
    import asyncio
    import time

    sys.path.insert(0, str(HERE))
    from bench_engine_speed import _engine, _requests
    from bench_real_model import default_model

    from ludic.inference import TransformersChatClient

    client = TransformersChatClient(model or default_model(), generate_in_thread=False)
    asyncio.run(_engine(client, _requests(32, 8, 0)))
    tokens, seconds = 0, 0.0
    for r in range(3):
        t0 = time.perf_counter()
        tokens += asyncio.run(_engine(client, _requests(32, 64, r + 1)))
        seconds += time.perf_counter() - t0
    return {"engine_tok_s": tokens / seconds}


def worker(kind: str, isa: str, args: argparse.Namespace) -> dict:
    """One worker process with ``$LUDIC_KERNELS_ISA=isa`` (the engine here, a GRPO step run by
    ``bench_real_model.py``); its JSON result."""
    model = [args.model] if args.model else []
    if kind == "engine":
        cmd = [sys.executable, __file__, *model, "--worker"]
    else:
        cmd = [sys.executable, str(REAL_MODEL), *model, "--worker", kind, "--steps", str(args.steps),
               "--out", str(Path(args.out) / f"{kind}-{isa}")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LUDIC_KERNELS_ISA": isa})
    if done.returncode != 0:
        raise RuntimeError(f"{kind} worker ({isa}) failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="transformers folder (default: the catalogue's)")
    parser.add_argument("--isa", default="auto", help="the kernels' instruction set: auto, avx512 or avx2")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per process (the first is warm-up); 0: skip")
    parser.add_argument("--out", default="runs/bench_kernel_isa")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(engine_worker(args.model)))
        return
    from ludic.kernels.cpu import native

    os.environ[native.ISA_ENV] = args.isa
    built = native.isa()
    if built is None:
        parser.error(f"no kernels to measure here: {native.unsupported()}")
    variants = (args.isa, "off")
    engine: dict[str, list[float]] = {v: [] for v in variants}
    steps: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            engine[v].append(worker("engine", v, args)["engine_tok_s"])
            if args.steps > 0:
                steps[v].append(worker("ludic", v, args))
            print(f"round {r + 1} {v}: engine {engine[v][-1]:.1f} tok/s"
                  + (f", step {statistics.median(steps[v][-1]['step_seconds']):.2f} s" if args.steps > 0 else ""),
                  flush=True)  # fmt: skip
    summary = {"cpu": platform_cpu(), "isa": built, "engine_tok_s": {v: statistics.median(engine[v]) for v in variants}}
    summary["engine_speedup"] = summary["engine_tok_s"][args.isa] / summary["engine_tok_s"]["off"]
    if args.steps > 0:
        for key, name in (("time/step_seconds", "step_s"), ("time/generate_seconds", "generate_s"),
                          ("time/forward_backward_seconds", "forward_backward_s")):  # fmt: skip
            summary[name] = {v: statistics.median(run["split"][key] for run in steps[v]) for v in variants}
            summary[name.replace("_s", "_speedup")] = summary[name]["off"] / summary[name][args.isa]
    print(json.dumps(summary, indent=2))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def platform_cpu() -> str:
    """This CPU's model name and torch's dispatch level (the figures are this CPU's)."""
    import torch

    name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")), "unknown")  # fmt: skip
    return f"{name}, {os.cpu_count()} cores, torch {torch.backends.cpu.get_cpu_capability()}"


if __name__ == "__main__":
    main()
