"""Measure the quickstart's promise on several seeds: before/after held-out reward and wall time.

    OMP_NUM_THREADS=2 .venv/bin/python bench/quickstart_seeds.py --seeds 0 1 2

Prints a Markdown table (the README's figures) and writes ``runs/quickstart_seeds/results.json``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from ludic.quickstart.config import QuickstartConfig
from ludic.quickstart.run import run_quickstart


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/quickstart_seeds")
    p.add_argument("--steps", type=int, default=None, help="override the quickstart's RL steps")
    args = p.parse_args()
    rows = []
    for seed in args.seeds:
        overrides = {"steps": args.steps} if args.steps is not None else {}
        cfg = QuickstartConfig(seed=seed, output_dir=f"{args.out}/seed{seed}", live=False, **overrides)
        result = run_quickstart(cfg)
        rows.append({"seed": seed, **asdict(result), "rl_gain": result.rl_gain})
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("| seed | initial model | after SFT (start of RL) | after RL | gain | wall time (s) | RL s/step |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['seed']} | {r['eval_initial']:.3f} | {r['eval_before_rl']:.3f} | {r['eval_after']:.3f} "
            f"| {r['rl_gain']:+.3f} | {r['train_seconds']:.0f} | {r['rl_seconds_per_step']:.3f} |"
        )


if __name__ == "__main__":
    main()
