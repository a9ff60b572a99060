"""``ludic quickstart``: build a tiny model, SFT warm start, GRPO on the letter task, report before/after.

The run itself is a ``ludic train`` run: the flags become a run config (``run_config.py``) that
``ludic.cli.run_config`` validates, builds, trains and finishes as it does a config file. The
quickstart adds evaluations before and after the SFT warm start (``warm_start.py``) and the summary.
Reads top to bottom: set-up -> eval (start) -> SFT -> eval (start of RL) -> RL -> eval (end)
-> checkpoint, plot, summary.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ludic.cli.run_config import TrainRun, build_train_run, finish_run, plan_start, train_steps
from ludic.quickstart.config import QuickstartConfig
from ludic.quickstart.run_config import (
    CONFIG_SOURCE,
    prepare_model_dir,
    refuse_model_dir_in_outputs,
    run_config_data,
    to_run_config,
    write_run_config,
)
from ludic.quickstart.summary import print_summary
from ludic.quickstart.warm_start import save_warm_model, warm_start


@dataclass
class QuickstartResult:
    """What a quickstart run measured and where it left its files."""

    eval_initial: float
    eval_before_rl: float
    eval_after: float
    train_seconds: float
    rl_seconds_per_step: float
    output_dir: str
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def rl_gain(self) -> float:
        return self.eval_after - self.eval_before_rl


def run_quickstart(cfg: QuickstartConfig) -> QuickstartResult:
    """Run the whole quickstart (one event loop for engine, trainer and evaluator)."""
    return asyncio.run(run_quickstart_async(cfg))


def build_quickstart_run(cfg: QuickstartConfig) -> tuple[TrainRun, dict[str, Any]]:
    """The run ``ludic train`` would build from the quickstart's config, and that config's data.

    Starts over: an earlier run's outputs in ``--output-dir`` are removed (listed first).
    """
    if cfg.algorithm == "sft":
        raise ValueError("--algorithm sft has no RL phase; pick an RL preset (grpo, cispo, ...)")
    from ludic.cli.preflight import preflight

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = prepare_model_dir(cfg)
    data = run_config_data(cfg, model_dir)
    run_cfg = to_run_config(data)
    refuse_model_dir_in_outputs(model_dir, run_cfg)
    preflight(run_cfg, train=True)  # the checks ludic train runs before any model loads
    plan_start(run_cfg, fresh=True, command=CONFIG_SOURCE)
    (out / "quickstart_config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    return build_train_run(run_cfg, log_prefix="[quickstart]"), data


async def run_quickstart_async(cfg: QuickstartConfig) -> QuickstartResult:
    run, data = build_quickstart_run(cfg)
    try:
        result = await _run_phases(cfg, run, data)
    finally:
        await run.close()  # pipeline mode's Redis, the trainer's worker thread
    (run.out_dir / "summary.json").write_text(
        json.dumps({**asdict(result), "rl_gain": result.rl_gain}, indent=2) + "\n"
    )
    print_summary(cfg, result)
    return result


async def _run_phases(cfg: QuickstartConfig, run: TrainRun, data: dict[str, Any]) -> QuickstartResult:
    out = run.out_dir
    evaluate = run.evaluator.evaluate

    start = time.perf_counter()
    initial = (await evaluate(step=-1))["eval/avg_total_reward"] if cfg.sft_steps else None
    if cfg.sft_steps:
        await warm_start(cfg, run)
        data["model"]["path"] = str(save_warm_model(run, out / "warm_start_model"))
    write_run_config(data, out / "run_config.yaml")
    before = (await evaluate(step=0))["eval/avg_total_reward"]
    rl_start = time.perf_counter()
    await train_steps(run)
    rl_seconds = time.perf_counter() - rl_start
    finished = await finish_run(run, title=f"Ludic quickstart ({cfg.algorithm})")
    after = finished.eval_stats["eval/avg_total_reward"]
    return QuickstartResult(
        eval_initial=initial if initial is not None else before,
        eval_before_rl=before,
        eval_after=after,
        train_seconds=time.perf_counter() - start,
        rl_seconds_per_step=rl_seconds / max(cfg.steps, 1),
        output_dir=str(out),
        paths={
            "metrics": str(out / "metrics.jsonl"),
            "plot": str(finished.plot),
            "model": str(finished.final_model),
            "checkpoint": str(finished.checkpoint or finished.final_model),
            "eval": str(out / "eval"),
            "config": str(out / "run_config.yaml"),
            "summary": str(out / "summary.json"),
        },
    )
