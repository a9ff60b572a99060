"""``ludic quickstart``: build a tiny model, SFT warm start, GRPO on the letter task, report before/after.

Reads top to bottom: set-up -> eval (start) -> SFT -> eval (start of RL) -> RL -> eval (end)
-> checkpoint, plot, summary. The set-up lives in ``runtime.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ludic.quickstart.config import QuickstartConfig
from ludic.quickstart.demonstrations import demonstration_items
from ludic.quickstart.pipeline import pipeline_parts
from ludic.quickstart.runtime import (
    SFT_SEED_OFFSET,
    Runtime,
    TrainRequests,
    build_runtime,
    make_evaluator,
    prepare_model_dir,
)
from ludic.quickstart.summary import print_summary
from ludic.training.loggers.dashboard import make_train_logger
from ludic.training.loggers.plot import plot_metrics


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


def _trainer_config(
    cfg: QuickstartConfig,
    lr: float,
    *,
    eval_every: int | None,
    schedule: dict[str, Any] | None = None,
    step_in_thread: bool = False,
) -> Any:
    from ludic.training.config import TrainerConfig

    return TrainerConfig(
        model_device=cfg.device,
        lr=lr,
        max_seq_len=256,
        micro_token_budget=256 * 64,
        max_grad_norm=1.0,
        sync_every_steps=1,
        eval_every_n_steps=eval_every or None,
        eval_concurrency=cfg.eval_episodes,
        step_in_thread=step_in_thread,
        **(schedule or {}),
    )


async def warm_start(cfg: QuickstartConfig, runtime: Runtime) -> None:
    """SFT on synthetic demonstrations (seeds disjoint from training and eval), then publish."""
    from ludic.distributed import ClientPublisher
    from ludic.training.batching import OfflineBatchSource
    from ludic.training.presets import make_sft
    from ludic.training.trainer import Trainer

    seeds = range(SFT_SEED_OFFSET, SFT_SEED_OFFSET + cfg.sft_steps * cfg.sft_batch_size)
    items = demonstration_items(runtime.tokenizer, seeds=seeds, count=cfg.count, letters=cfg.letters)
    source = OfflineBatchSource(items, batch_size=cfg.sft_batch_size, shuffle=False)
    trainer = Trainer(
        model=runtime.model,
        algo=make_sft(),
        batch_source=source,
        publisher=ClientPublisher(runtime.client),
        cfg=_trainer_config(cfg, cfg.sft_lr, eval_every=None),
    )
    await trainer.train(cfg.sft_steps)


async def train_rl(cfg: QuickstartConfig, runtime: Runtime, evaluator: Any, out: Path) -> Any:
    """GRPO (or the chosen preset) with weights pushed to the embedded engine every step."""
    from ludic.distributed import ClientPublisher
    from ludic.registry import get_algorithm
    from ludic.training.batching import RolloutBatchSource

    algo = get_algorithm(cfg.algorithm)(group_size=cfg.group_size) if cfg.algorithm != "sft" else None
    if algo is None:
        raise ValueError("--algorithm sft has no RL phase; pick an RL preset (grpo, cispo, ...)")
    source = RolloutBatchSource(
        engine=runtime.engine,
        request_fn=TrainRequests(cfg, runtime.sampling),
        algorithm=algo,
        max_steps=1,
        concurrency=cfg.group_size * cfg.prompts_per_step,
    )
    if cfg.pipeline:  # the same source feeds an actor task; the trainer reads the Redis stream
        async with pipeline_parts(cfg, runtime.client, source) as parts:
            return await _train(
                cfg, runtime, evaluator, out, algo, parts.batch_source, parts.publisher, parts.actors
            )
    return await _train(cfg, runtime, evaluator, out, algo, source, ClientPublisher(runtime.client))


async def _train(
    cfg: QuickstartConfig,
    runtime: Runtime,
    evaluator: Any,
    out: Path,
    algo: Any,
    source: Any,
    publisher: Any,
    actors: list[Any] | None = None,
) -> Any:
    from ludic.training.batching.pipeline_local import train_alongside
    from ludic.training.config import CheckpointConfig
    from ludic.training.trainer import Trainer

    logger = make_train_logger(out / "metrics.jsonl", total_steps=cfg.steps, live=cfg.live, prefix="[quickstart]")
    # linear warm-up, then linear decay to 0 at the last step (why: ludic.training.schedule)
    schedule = {"lr_schedule": "linear", "warmup_steps": min(cfg.warmup_steps, cfg.steps), "total_steps": cfg.steps}
    trainer = Trainer(
        model=runtime.model,
        algo=algo,
        batch_source=source,
        publisher=publisher,
        # pipeline: the step computes on a worker thread, so the actor task keeps generating meanwhile
        cfg=_trainer_config(cfg, cfg.lr, eval_every=cfg.eval_every, schedule=schedule, step_in_thread=cfg.pipeline),
        train_logger=logger,
        checkpoint_config=CheckpointConfig(
            output_dir=out / "checkpoints", max_to_keep=1, save_optimizer=False
        ),
        evaluator=evaluator,
    )
    with logger:  # pipeline mode: a failed actor stops training (the trainer would wait for items)
        await train_alongside(trainer.train(cfg.steps), actors or [])
    return trainer


def run_quickstart(cfg: QuickstartConfig) -> QuickstartResult:
    """Run the whole quickstart (one event loop for engine, trainer and evaluator)."""
    return asyncio.run(run_quickstart_async(cfg))


async def run_quickstart_async(cfg: QuickstartConfig) -> QuickstartResult:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quickstart_config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    runtime = build_runtime(cfg, prepare_model_dir(cfg))
    evaluator = make_evaluator(cfg, runtime, out / "eval")
    evaluate = evaluator.evaluate

    start = time.perf_counter()
    initial = (await evaluate(step=-1))["eval/avg_total_reward"] if cfg.sft_steps else None
    if cfg.sft_steps:
        await warm_start(cfg, runtime)
    before = (await evaluate(step=0))["eval/avg_total_reward"]
    rl_start = time.perf_counter()
    trainer = await train_rl(cfg, runtime, evaluator, out)
    rl_seconds = time.perf_counter() - rl_start
    after = (await evaluate(step=cfg.steps))["eval/avg_total_reward"]
    train_seconds = time.perf_counter() - start

    checkpoint = trainer.save_checkpoint()
    final_dir = out / "final_model"
    runtime.model.save_pretrained(final_dir)
    runtime.tokenizer.save_pretrained(final_dir)
    plot = plot_metrics(
        out / "metrics.jsonl", out / "training_curve.png", title=f"Ludic quickstart ({cfg.algorithm})"
    )
    result = QuickstartResult(
        eval_initial=initial if initial is not None else before,
        eval_before_rl=before,
        eval_after=after,
        train_seconds=train_seconds,
        rl_seconds_per_step=rl_seconds / max(cfg.steps, 1),
        output_dir=str(out),
        paths={
            "metrics": str(out / "metrics.jsonl"),
            "plot": str(plot),
            "model": str(final_dir),
            "checkpoint": str(checkpoint) if checkpoint else str(final_dir),
            "eval": str(out / "eval"),
            "summary": str(out / "summary.json"),
        },
    )
    (out / "summary.json").write_text(
        json.dumps({**asdict(result), "rl_gain": result.rl_gain}, indent=2) + "\n"
    )
    print_summary(cfg, result)
    return result
