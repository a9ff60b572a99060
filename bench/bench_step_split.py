"""Where Ludic's step in a TRL-curve cell spends its time as it runs: matmuls, attention and the rest.

``bench_step_floor.py`` times the step's matrix products alone, with hot caches, at the faster library.
This script profiles the step itself (``torch.profiler``, one generation and one training step on the
batch it generated, after warm-up steps) and sums the ops' own times by kind:

- **matmul**: the linear layers' products (oneDNN's inner product, its weight-gradient primitive, BLAS);
- **oneDNN copies**: the layout copies those primitives need (``to_mkldnn``, the decoder's weight packing);
- **attention**: the SDPA kernels (decoding over the KV cache, training over the packed rows);
- **rest**: the phase's unprofiled time (median of the timed steps) minus the above: elementwise work,
  sampling, the optimizer, the Python of the loop.

The profiler's own cost lands in the per-op overhead, so the kernels are read from the profile and the
rest from unprofiled steps. With ``--curve results.json`` (from ``bench_vs_trl_curve.py``) each cell's TRL
step is set beside the kernels: ``TRL / (matmul + attention)`` is the lead Ludic would have if everything
but those kernels, as they run inside its step, cost nothing.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_step_split.py --sizes 6M 25M --replies 128 \\
        --curve runs/bench_vs_trl_curve/results.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

from bench_vs_trl_curve import cell_setup, ludic_trainer
from curve_models import SIZES

from ludic.quickstart.config import QuickstartConfig

KINDS: dict[str, tuple[str, ...]] = {  # kind: substrings of the profiler's op names
    "matmul": ("_linear_pointwise", "mkldnn_linear_backward_weights", "aten::mm", "aten::addmm", "aten::bmm"),
    "onednn_copies": ("to_mkldnn", "_reorder_linear_weight"),
    "attention": ("scaled_dot_product", "flash_attention"),
}


def kind_of(op_name: str) -> str | None:
    """The kernel kind an op's self time counts to (None: the rest)."""
    for kind, needles in KINDS.items():
        if any(needle in op_name for needle in needles):
            return kind
    return None


def kernel_seconds(profile: Any) -> dict[str, float]:
    """Self CPU seconds per kind in a finished ``torch.profiler.profile``."""
    sums = dict.fromkeys(KINDS, 0.0)
    for event in profile.key_averages():
        kind = kind_of(event.key)
        if kind is not None:
            sums[kind] += event.self_cpu_time_total / 1e6
    return sums


class FixedBatch:
    """A batch source that hands out one batch again (the training step of the profiled batch)."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    async def next_batch(self) -> Any:
        return self.batch


async def split_cell(cfg: QuickstartConfig, model_dir: Path, steps: int) -> dict[str, dict[str, float]]:
    """Unprofiled phase medians over ``steps`` steps (after one warm-up), then one profiled generation
    and one profiled training step of that batch; kernels from the profile, the rest by difference."""
    from torch.profiler import profile

    trainer, source, client = ludic_trainer(cfg, model_dir)
    generation, training = [], []
    for _ in range(steps + 1):
        stats = await trainer.train_step()
        generation.append(source.seconds[-1])
        training.append(
            stats["perf/step_seconds"] - source.seconds[-1] - stats.get("perf/publish_seconds", 0.0)
        )
    with profile() as gen_profile:
        batch = await source.next_batch()
    trainer.batch_source = FixedBatch(batch)
    await trainer.train_step()  # the fixed batch once unprofiled, so the profiled step meets warm state
    with profile() as train_profile:
        await trainer.train_step()
    client.close() if hasattr(client, "close") else None
    phases = {}
    for phase, times, prof in (
        ("generation", generation, gen_profile),
        ("training", training, train_profile),
    ):
        wall = statistics.median(times[1:])
        kernels = kernel_seconds(prof)
        phases[phase] = {"wall": wall, **kernels, "rest": wall - sum(kernels.values())}
    return phases


def table(cells: list[dict[str, Any]]) -> str:
    lines = [
        "| model | reply tokens | phase | s (unprofiled) | matmul | oneDNN copies | attention | rest | TRL / (matmul + attention) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for c in cells:
        for phase, p in c["phases"].items():
            bound = f"{c['trl'] / c['kernels']:.2f}x" if c.get("trl") and phase == "training" else ""
            lines.append(
                f"| {c['size']} | {c['reply_tokens']} | {phase} | {p['wall']:.3f} | {p['matmul']:.3f} | "
                f"{p['onednn_copies']:.3f} | {p['attention']:.3f} | {p['rest']:.3f} | {bound} |"
            )
    return "\n".join(lines)


def trl_steps(curve: Path | None) -> dict[tuple[str, int], float]:
    """TRL's s/step per (size, reply tokens) from a curve's ``results.json``."""
    if curve is None:
        return {}
    return {(c["size"], c["reply_tokens"]): c["trl"]["s_per_step"] for c in json.loads(curve.read_text())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["6M", "25M"], choices=list(SIZES))
    parser.add_argument("--replies", nargs="+", type=int, default=[128])
    parser.add_argument("--steps", type=int, default=2, help="unprofiled timed steps per cell")
    parser.add_argument("--curve", type=Path, help="bench_vs_trl_curve.py's results.json, for TRL's step")
    parser.add_argument("--out", default="runs/bench_step_split")
    args = parser.parse_args()
    trl = trl_steps(args.curve)
    cells = []
    for size in args.sizes:
        for reply in args.replies:
            cfg, model_dir = cell_setup(size, reply, args.steps, Path(args.out) / f"{size}_{reply}")
            phases = asyncio.run(split_cell(cfg, model_dir, args.steps))
            kernels = sum(p["matmul"] + p["attention"] for p in phases.values())
            cell = {"size": size, "reply_tokens": reply, "phases": phases, "kernels": kernels,
                    "trl": trl.get((size, reply))}  # fmt: skip
            print(json.dumps(cell), flush=True)
            cells.append(cell)
    print(table(cells))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(cells, indent=2) + "\n")


if __name__ == "__main__":
    main()
