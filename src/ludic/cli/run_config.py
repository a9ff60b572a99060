"""A RunConfig's run: built once (:func:`build_train_run`), trained (:func:`train_steps`), finished
(:func:`finish_run`); ``ludic train`` and ``ludic quickstart`` both go through these three.

The parts themselves (policy, client, engine, algorithm, evaluator, rollout source) come from
``ludic.cli.runtime``; pipeline mode's Redis and actors from ``ludic.cli.pipeline_mode``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ludic.cli.run_loggers import completions_logger, config_loggers
from ludic.cli.runtime import (
    load_policy,
    load_tokenizer,
    make_algorithm,
    make_client,
    make_engine,
    make_evaluator,
    make_publisher,
    make_rollout_source,
)
from ludic.cli.warm_start import BEFORE_SFT_STEP, report_start_and_end, start_of_run
from ludic.config import RunConfig


@dataclass
class TrainRun:
    """The live objects of one training run."""

    cfg: RunConfig
    trainer: Any
    evaluator: Any
    logger: Any
    out_dir: Path
    client: Any
    engine: Any
    algo: Any
    pipeline: Any = None
    """Pipeline mode's live pieces (``ludic.cli.pipeline_mode.PipelineMode``), else None."""
    publisher: Any = None
    """What sends the weights to ``client`` (``runtime.make_publisher``), under pipeline mode's version
    announcement: the SFT warm start publishes through it too (a vLLM backend's weight-transfer group is
    joined once per run)."""
    _pipeline_closed: bool = field(default=False, init=False, repr=False)

    def rollout_source(self, first_seed: int | None = None) -> Any:
        """A RolloutBatchSource from ``first_seed`` (what each pipeline actor plays)."""
        return make_rollout_source(self.cfg, self.engine, self.algo, first_seed)

    async def close_pipeline(self) -> None:
        """Close pipeline mode's stream reader and stop its private Redis (once; no-op without pipeline)."""
        if self.pipeline is None or self._pipeline_closed:
            return
        self._pipeline_closed = True
        try:
            await self.pipeline.batch_source.close()
        finally:
            self.pipeline.close()

    async def close(self) -> None:
        """Release what the run holds: the pipeline's Redis, the trainer's worker thread (idempotent)."""
        try:
            await self.close_pipeline()
        finally:
            self.trainer.close()
            if callable(getattr(self.publisher, "close", None)):
                self.publisher.close()  # a broadcast publisher's worker threads


@dataclass
class FinishedRun:
    """What :func:`finish_run` measured and wrote."""

    eval_stats: dict[str, float]
    final_model: Path
    checkpoint: Path | None
    plot: Path | None


def output_paths(cfg: RunConfig) -> list[Path]:
    """What a run writes (and ``--fresh`` removes): metrics, checkpoints, eval results, final model, plot."""
    out = Path(cfg.logging.output_dir)
    paths = [out / "metrics.jsonl", out / "eval", out / "final_model", out / "training_curve.png"]
    if cfg.pipeline.enabled and not cfg.pipeline.redis_url:
        from ludic.cli.pipeline_mode import redis_dir

        paths.append(redis_dir(cfg))  # the private Redis's stream, kept for resume
    return paths + ([Path(cfg.checkpoint.output_dir)] if cfg.checkpoint is not None else [])


def plan_start(cfg: RunConfig, *, fresh: bool, command: str = "ludic train --fresh") -> bool:
    """Decide, before anything loads, whether this run resumes (True) or starts from step 0.

    ``fresh`` removes an earlier run's outputs (saying which); without it a run resumes from its
    latest checkpoint, and earlier outputs with no checkpoint to resume from are an error.
    """
    from ludic.training.checkpoint.manager import CheckpointManager
    from ludic.training.checkpoint.resume import ResumeError, describe_outputs, remove_outputs
    from ludic.training.run_outputs import claim_outputs

    existing = describe_outputs(output_paths(cfg))
    out_dir, ckpt_dir = Path(cfg.logging.output_dir), cfg.checkpoint and Path(cfg.checkpoint.output_dir)
    if fresh:
        if existing:  # only what a Ludic run wrote; anything else in the way: refused, nothing deleted
            removed = remove_outputs(output_paths(cfg), owner_dir=out_dir, checkpoint_dir=ckpt_dir)
            print(f"{command}: starting over; removed\n  " + "\n  ".join(map(str, removed)), flush=True)
        claim_outputs(output_paths(cfg), out_dir)
        return False
    if cfg.checkpoint is not None and CheckpointManager(cfg.checkpoint).has_checkpoint():  # broken: fallback
        claim_outputs(output_paths(cfg), out_dir)
        return True
    metrics = Path(cfg.logging.output_dir) / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        raise ResumeError(
            f"{metrics} holds an earlier run's metrics and there is no checkpoint to resume from "
            f"({'no [checkpoint] table' if cfg.checkpoint is None else cfg.checkpoint.output_dir}); "
            "pass --fresh to start over (it removes: " + "; ".join(existing) + ")"
        )
    claim_outputs(output_paths(cfg), out_dir)
    return False


def build_train_run(
    cfg: RunConfig,
    reducers: dict[str, Any] | None = None,
    *,
    resume: bool = False,
    log_prefix: str = "[ludic]",
) -> TrainRun:
    """Everything a training run needs, built in dependency order; ``resume`` loads the latest checkpoint.

    reducers: extra ``eval/`` statistics for the evaluator; log_prefix: the plain-text logger's tag.
    """
    import torch

    from ludic.cli.pipeline_mode import build_pipeline_mode
    from ludic.training.loggers.dashboard import make_train_logger
    from ludic.training.trainer import Trainer

    torch.manual_seed(cfg.seed)
    out = Path(cfg.logging.output_dir)
    model = load_policy(cfg)
    client = make_client(cfg, model)  # a [lora] run's embedded engine shares the frozen base
    publisher = make_publisher(cfg, client)  # [lora].publish: the adapter alone or merged weights
    engine = make_engine(cfg, client, cfg.rollout.sampling.to_sampling())
    algo = make_algorithm(cfg)
    evaluator = make_evaluator(cfg, engine, out / "eval", reducers)
    if cfg.eval.every_n_steps:
        cfg.trainer.eval_every_n_steps = cfg.eval.every_n_steps
    vocab_size = model.get_input_embeddings().num_embeddings  # pipeline items are checked against it
    pipeline = build_pipeline_mode(cfg, publisher, vocab_size=vocab_size) if cfg.pipeline.enabled else None
    try:
        trainer = Trainer(
            model=model,
            algo=algo,
            batch_source=pipeline.batch_source if pipeline else make_rollout_source(cfg, engine, algo),
            publisher=pipeline.publisher if pipeline else publisher,
            cfg=cfg.trainer,
            checkpoint_config=cfg.checkpoint,
            evaluator=evaluator,
        )
        if resume:  # before the metrics file is opened: records after the checkpoint are dropped
            resume_run(trainer, cfg)
    except BaseException:
        if pipeline is not None:
            pipeline.close()  # the private Redis it started
        raise
    if trainer.checkpointer is not None:  # each checkpoint folder is a whole model for ``ludic eval --model``
        trainer.checkpointer.tokenizer = getattr(client, "tokenizer", None) or load_tokenizer(cfg)
    trainer.train_logger = make_train_logger(
        out / "metrics.jsonl", total_steps=cfg.steps, live=cfg.logging.rich, prefix=log_prefix,
        extra=config_loggers(cfg),  # [logging] wandb / tensorboard
        completions=completions_logger(cfg, trainer, client),  # [logging] completions_every
    )  # fmt: skip
    return TrainRun(
        cfg=cfg, trainer=trainer, evaluator=evaluator, logger=trainer.train_logger, out_dir=out,
        client=client, engine=engine, algo=algo, pipeline=pipeline, publisher=publisher,
    )  # fmt: skip


def resume_run(trainer: Any, cfg: RunConfig, *, main: bool = True) -> None:
    """Load the latest checkpoint (every rank of a distributed run: DCP reads each rank's share, resharded to
    the world now); the main process then aligns ``metrics.jsonl`` with it and says where the run resumes."""
    from ludic.training.checkpoint.resume import align_metrics, resume_checkpoint

    resumed = resume_checkpoint(trainer)
    if not main:
        return
    metrics = align_metrics(Path(cfg.logging.output_dir) / "metrics.jsonl", resumed, log_every=trainer.cfg.log_every)
    restored = f"; step {resumed.step}'s record restored from the checkpoint" if metrics.restored else ""
    print(f"ludic train: resuming at step {resumed.step} of {cfg.steps} from {trainer.checkpointer.output_dir} "
          f"({metrics.dropped} metrics records after it dropped{restored})", flush=True)  # fmt: skip


async def train_steps(run: TrainRun) -> None:
    """Train from the trainer's step up to ``[steps]``, logging to ``metrics.jsonl``.

    In pipeline mode ``[pipeline].actors`` actor tasks run beside the trainer (a failed actor stops
    training) and the Redis stream is closed afterwards. A step watchdog (``ludic.training.watchdog``) watches
    the loop.
    """
    from ludic.cli.pipeline_mode import running_actors
    from ludic.training.pipeline.local import train_alongside
    from ludic.training.watchdog import watch_steps

    remaining = max(run.cfg.steps - run.trainer.step, 0)
    bounds = run.cfg.timeouts  # the watchdog reports a step stalled past step_watchdog_s ([timeouts])
    try:
        with run.logger, watch_steps(lambda: run.trainer.step, bound_s=bounds.step_watchdog_s, on_stall=bounds.on_stall):
            if run.pipeline is None:
                await run.trainer.train(remaining)
            else:
                async with running_actors(run.cfg, run.pipeline, run.client, run.rollout_source) as actors:
                    await train_alongside(run.trainer.train(remaining), actors)
    finally:
        await run.close_pipeline()


def final_checkpoint(trainer: Any) -> Path | None:
    """The checkpoint at the run's last step (None without a checkpointer): the one ``every_n_steps`` wrote at
    that step when it did (the same state, with the step's stats), else a new one. Collective under a
    ``DistributedCheckpointer``: every rank saved the same steps, so every rank takes the same branch."""
    if trainer.checkpointer is None:
        return None
    return trainer.checkpointer.saved_at(trainer.step) or trainer.save_checkpoint()


async def final_evaluation(evaluator: Any, trainer: Any, steps: int) -> dict[str, float]:
    """The held-out evaluation at step ``steps``: the Trainer's own when it evaluated at that step, else a new one."""
    if trainer.step == steps and getattr(evaluator, "last_step", None) == steps:
        return dict(evaluator.last_stats)
    return await evaluator.evaluate(step=steps)


async def finish_run(run: TrainRun, *, title: str | None = None) -> FinishedRun:
    """Checkpoint (the end is resumable: run again with more steps), evaluate, save the final model, plot (last:
    a plot that fails costs no model)."""
    from ludic.training.loggers.plot import plot_metrics

    cfg = run.cfg
    checkpoint = final_checkpoint(run.trainer)
    stats = await final_evaluation(run.evaluator, run.trainer, cfg.steps)
    final = run.out_dir / "final_model"
    run.trainer.model.save_pretrained(final)
    load_tokenizer(cfg).save_pretrained(final)
    plot = None
    if cfg.logging.plot:
        plot = plot_metrics(  # with every held-out evaluation: before (and after) the SFT, during, at the end
            run.out_dir / "metrics.jsonl", run.out_dir / "training_curve.png", title=title or cfg.source,
            eval_dir=run.out_dir / "eval",
        )  # fmt: skip
    return FinishedRun(eval_stats=stats, final_model=final, checkpoint=checkpoint, plot=plot)


def train_from_config(
    cfg: RunConfig, reducers: dict[str, Any] | None = None, *, fresh: bool = False
) -> dict[str, float]:
    """``ludic train``: train up to ``cfg.steps`` steps, evaluate, plot; returns the final eval stats.

    Resumes from the latest checkpoint unless ``fresh`` (see :func:`plan_start`); ``[sft]`` warm-starts
    a fresh run before RL (``ludic.cli.warm_start``).
    reducers: extra ``eval/`` statistics (``{name: Reducer}``) for the evaluations.
    """

    from ludic.cli.distributed_run import train_distributed, under_torchrun

    if under_torchrun() or cfg.cluster is not None:  # FSDP2 ranks, or one role of a multi-host run
        return train_distributed(cfg, reducers, fresh=fresh)

    async def _train() -> dict[str, float]:
        run = build_train_run(cfg, reducers, resume=plan_start(cfg, fresh=fresh))
        try:
            start = await start_of_run(run)  # eval, [sft] warm start, eval (read back when resuming)
            for step, stats in ((BEFORE_SFT_STEP, start.before_sft), (0, start.start_of_rl)):
                if stats:  # the screen shows the latest held-out evaluation from the start
                    run.logger.show_eval(step, stats)
            await train_steps(run)
            after = (await finish_run(run)).eval_stats
        finally:
            await run.close()
        report_start_and_end(start, after, run.out_dir / "eval")
        return after

    return asyncio.run(_train())


def eval_from_config(cfg: RunConfig, reducers: dict[str, Any] | None = None) -> dict[str, float]:
    """``ludic eval``: play the held-out episodes once with ``[eval].sampling``."""

    async def _eval() -> dict[str, float]:
        client = make_client(cfg)
        engine = make_engine(cfg, client, cfg.eval.sampling.to_sampling())
        out = Path(cfg.logging.output_dir) / "eval"
        return await make_evaluator(cfg, engine, out, reducers).evaluate()

    return asyncio.run(_eval())
