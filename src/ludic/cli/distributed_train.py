"""The body of ``ludic train`` on every trainer rank (``ludic.cli.distributed_run.train_distributed`` starts it).

The same parts as the one-process run (``ludic.cli.runtime``, ``ludic.cli.run_config.TrainRun``), placed by
rank: every rank loads the policy and, under torchrun, shards it with FSDP2 (a world of 1 too, so a DCP
checkpoint written by N ranks resumes on fewer); rank 0 alone builds the inference client's engine, the
evaluator, the Redis stream reader and the publisher (``Rank0BatchSource`` / ``Rank0OnlyPublisher`` factories
are never called elsewhere), decides fresh-or-resume, logs and plots. Checkpoints and the final export are
collective: every rank takes part.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from ludic.config import RunConfig


def _is_main() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def _agreed(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (itself outside a process group)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return value
    from ludic.training.parallel.collectives import broadcast_json

    return broadcast_json(value if dist.get_rank() == 0 else None, src=0)


def _sharded_policy(cfg: RunConfig) -> Any:
    import torch.distributed as dist

    from ludic.cli.runtime import load_policy
    from ludic.training.parallel.fsdp import FSDPConfig, shard_model

    model = load_policy(cfg)
    if dist.is_initialized():
        shard_model(model, FSDPConfig())
    return model


def build_distributed_run(cfg: RunConfig, reducers: dict[str, Any] | None, *, resume: bool) -> Any:
    """A ``TrainRun`` for this rank (see the module docstring)."""
    import torch

    from ludic.cli.distributed_run import cluster_client, fanout_publisher, pipeline_on
    from ludic.cli.pipeline_mode import build_pipeline_mode
    from ludic.cli.run_config import TrainRun, resume_run
    from ludic.cli.run_loggers import completions_logger, config_loggers
    from ludic.cli.runtime import (
        make_algorithm,
        make_client,
        make_engine,
        make_evaluator,
        make_rollout_source,
    )
    from ludic.distributed import ClientPublisher, Rank0OnlyPublisher
    from ludic.training.loggers.dashboard import make_train_logger
    from ludic.training.parallel.batch import Rank0BatchSource
    from ludic.training.trainer import Trainer

    torch.manual_seed(cfg.seed)
    out, main = Path(cfg.logging.output_dir), _is_main()
    model = _sharded_policy(cfg)
    algo = make_algorithm(cfg)
    client = engine = evaluator = pipeline = source = publisher = inner = None
    if main:
        client = cluster_client(cfg.cluster) if cfg.cluster is not None else make_client(cfg)
        engine = make_engine(cfg, client, cfg.rollout.sampling.to_sampling())
        evaluator = make_evaluator(cfg, engine, out / "eval", reducers)
        inner = (
            fanout_publisher(cfg.cluster, timeout_s=cfg.timeouts.publish_s)
            if cfg.cluster is not None
            else ClientPublisher(client)
        )
        vocab = model.get_input_embeddings().num_embeddings
        pipeline = build_pipeline_mode(cfg, inner, vocab_size=vocab) if pipeline_on(cfg) else None
        source = pipeline.batch_source if pipeline else make_rollout_source(cfg, engine, algo)
        publisher = pipeline.publisher if pipeline else inner
    if cfg.eval.every_n_steps:
        cfg.trainer.eval_every_n_steps = cfg.eval.every_n_steps
    try:
        trainer = Trainer(
            model=model, algo=algo, batch_source=Rank0BatchSource(lambda: source),
            publisher=Rank0OnlyPublisher(lambda: publisher), cfg=cfg.trainer,
            checkpoint_config=cfg.checkpoint, evaluator=evaluator,
        )  # fmt: skip
        if resume:
            resume_run(trainer, cfg, main=main)
    except BaseException:
        if pipeline is not None:
            pipeline.close()
        raise
    logger: Any = contextlib.nullcontext()
    if main:
        logger = trainer.train_logger = make_train_logger(
            out / "metrics.jsonl", total_steps=cfg.steps, live=cfg.logging.rich, prefix="[ludic]",
            extra=config_loggers(cfg), completions=completions_logger(cfg, trainer, client),
        )  # fmt: skip
    return TrainRun(
        cfg=cfg, trainer=trainer, evaluator=evaluator, logger=logger, out_dir=out,
        client=client, engine=engine, algo=algo, pipeline=pipeline, publisher=inner,  # closed with the run
    )  # fmt: skip


async def run_distributed(cfg: RunConfig, reducers: dict[str, Any] | None = None, *, fresh: bool) -> dict:
    """Plan (rank 0), build, evaluate (rank 0), train, checkpoint, evaluate and export; rank 0's stats."""
    from ludic.cli.run_config import final_checkpoint, final_evaluation, plan_start, train_steps
    from ludic.cli.runtime import load_tokenizer
    from ludic.cli.warm_start import report_start_and_end, start_of_run
    from ludic.training.loggers.plot import plot_metrics
    from ludic.training.parallel.publish import export_pretrained

    main = _is_main()
    resume = _agreed(plan_start(cfg, fresh=fresh) if main else None)
    run = build_distributed_run(cfg, reducers, resume=bool(resume))
    try:
        start = await start_of_run(run) if main else None  # held-out eval at the start (read back on resume)
        if main and start.start_of_rl:
            run.logger.show_eval(0, start.start_of_rl)
        await train_steps(run)  # the step watchdog; [cluster]: no actor tasks here (`ludic actor` runs them)
        final_checkpoint(run.trainer)  # every rank writes its shards (or every rank has, at the last step)
        after = await final_evaluation(run.evaluator, run.trainer, cfg.steps) if main else {}
        export_pretrained(run.trainer.model, run.out_dir / "final_model",
                          tokenizer=load_tokenizer(cfg) if main else None)  # fmt: skip
        if main and cfg.logging.plot:
            plot_metrics(run.out_dir / "metrics.jsonl", run.out_dir / "training_curve.png", title=cfg.source,
                         eval_dir=run.out_dir / "eval")  # fmt: skip
    finally:
        await run.close()
    if main:
        report_start_and_end(start, after, run.out_dir / "eval")
    return after
