"""Turn a validated RunConfig into live objects (model, client, engine, trainer) and run them."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic.config import RunConfig
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.registry import ENV_REGISTRY, get_algorithm, get_harness, get_protocol
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest


def make_client(cfg: RunConfig) -> Any:
    """The inference backend named by ``[inference]``."""
    if cfg.inference.backend == "server":
        from ludic.inference import VLLMChatClient

        return VLLMChatClient(base_url=cfg.inference.server_url, enable_weight_updates=True)
    from ludic.inference import TransformersChatClient

    return TransformersChatClient(
        cfg.model.path,
        cfg.model.tokenizer,
        generate_in_thread=True if cfg.pipeline.enabled else None,  # pipeline: decode beside the trainer
        device=cfg.model.device,
        max_batch_size=cfg.inference.max_batch_size,
        model_name=cfg.model.path,
        dtype=cfg.model.dtype,
    )


def make_engine(cfg: RunConfig, client: Any, sampling: SamplingConfig) -> Any:
    """RolloutEngine whose protocol factory builds a fresh agent (harness) per episode."""
    from ludic.training.batching import RolloutEngine

    harness = get_harness(cfg.harness.name)
    protocol = get_protocol(cfg.protocol.name)
    tokenizer = getattr(client, "tokenizer", None) or _tokenizer(cfg)  # token-in for server backends too

    def make_protocol(**protocol_kwargs: Any) -> Any:
        agent = harness(
            client=client, model=cfg.model.path, tokenizer=tokenizer, sampling=sampling, **cfg.harness.kwargs
        )
        return protocol(agent=agent, **protocol_kwargs)

    return RolloutEngine(
        env_registry={cfg.env.name: ENV_REGISTRY.get(cfg.env.name)},
        protocol_registry={cfg.protocol.name: make_protocol},
    )


def make_requests(
    cfg: RunConfig,
    *,
    first_seed: int,
    n: int,
    sampling: SamplingConfig,
    env_kwargs: dict[str, Any] | None = None,
) -> list[RolloutRequest]:
    """``n`` requests with consecutive env seeds; ``env_kwargs`` override ``[env].kwargs``."""
    kwargs = {**cfg.env.kwargs, **(env_kwargs or {})}
    return [
        RolloutRequest(
            env=EnvSpec(kind=cfg.env.name, kwargs=dict(kwargs)),
            protocol=ProtocolSpec(kind=cfg.protocol.name, kwargs=dict(cfg.protocol.kwargs)),
            env_seed=first_seed + i,
            sampling_seed=first_seed + i,
            inference=InferenceSpec(sampling=sampling),
            meta={"env_seed": first_seed + i},
        )
        for i in range(n)
    ]


def make_algorithm(cfg: RunConfig) -> Any:
    """The preset named by ``[algorithm]``; ``group_size`` defaults to ``[rollout].group_size``."""
    preset = get_algorithm(cfg.algorithm.name)
    kwargs = dict(cfg.algorithm.kwargs)
    params = inspect.signature(preset).parameters
    if "group_size" in params:
        kwargs.setdefault("group_size", cfg.rollout.group_size)
    if "teacher_device" in params:  # a frozen teacher runs beside the policy, batched like it
        kwargs.setdefault("teacher_device", cfg.model.device)
        kwargs.setdefault("micro_token_budget", cfg.trainer.micro_token_budget)
    return preset(**kwargs)


def make_evaluator(cfg: RunConfig, engine: Any, out_dir: Path, reducers: dict[str, Any] | None = None) -> Any:
    from ludic.eval import Evaluator

    sampling = cfg.eval.sampling.to_sampling()
    requests = make_requests(
        cfg,
        first_seed=cfg.eval.seed_offset,
        n=cfg.eval.num_episodes,
        sampling=sampling,
        env_kwargs=cfg.eval.env_kwargs,
    )
    return Evaluator(
        engine=engine,
        requests=requests,
        max_steps=cfg.rollout.max_steps,
        sampling=sampling,
        concurrency=cfg.eval.concurrency,
        out_dir=out_dir,
        reducers=reducers,
    )


class GroupedRequests:
    """``request_fn``: ``prompts_per_step`` fresh env seeds per call (RolloutBatchSource groups them)."""

    def __init__(self, cfg: RunConfig, sampling: SamplingConfig) -> None:
        self.cfg, self.sampling = cfg, sampling
        self.next_seed = cfg.rollout.seed

    def __call__(self) -> list[RolloutRequest]:
        n = self.cfg.rollout.prompts_per_step
        base = make_requests(self.cfg, first_seed=self.next_seed, n=n, sampling=self.sampling)
        self.next_seed += n
        return base

    def state_dict(self) -> dict[str, Any]:
        """The data position: the next env seed (the batch source saves its group counter itself)."""
        return {"next_seed": self.next_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_seed = int(state["next_seed"])


@dataclass
class TrainRun:
    trainer: Any
    evaluator: Any
    logger: Any
    out_dir: Path
    pipeline: Any = None
    """Pipeline mode's live pieces (``ludic.cli.pipeline_mode.PipelineMode``), else None."""
    client: Any = None
    rollout_source: Any = None
    """``rollout_source(first_seed)`` -> a RolloutBatchSource (what each pipeline actor plays)."""


def output_paths(cfg: RunConfig) -> list[Path]:
    """What a run writes (and ``--fresh`` removes): metrics, checkpoints, eval results, final model, plot."""
    out = Path(cfg.logging.output_dir)
    paths = [out / "metrics.jsonl", out / "eval", out / "final_model", out / "training_curve.png"]
    if cfg.pipeline.enabled and not cfg.pipeline.redis_url:
        from ludic.cli.pipeline_mode import redis_dir

        paths.append(redis_dir(cfg))  # the private Redis's stream, kept for resume
    return paths + ([Path(cfg.checkpoint.output_dir)] if cfg.checkpoint is not None else [])


def plan_start(cfg: RunConfig, *, fresh: bool) -> bool:
    """Decide, before anything loads, whether this run resumes (True) or starts from step 0.

    ``fresh`` removes an earlier run's outputs (saying which); without it a run resumes from its
    latest checkpoint, and earlier outputs with no checkpoint to resume from are an error.
    """
    from ludic.training.checkpoint import CheckpointManager
    from ludic.training.resume import ResumeError, describe_outputs, remove_outputs

    existing = describe_outputs(output_paths(cfg))
    if fresh:
        if existing:
            print("ludic train --fresh: starting over; removing\n  " + "\n  ".join(existing), flush=True)
            remove_outputs(output_paths(cfg))
        return False
    if cfg.checkpoint is not None and CheckpointManager(cfg.checkpoint).latest_path() is not None:
        return True
    metrics = Path(cfg.logging.output_dir) / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        raise ResumeError(
            f"{metrics} holds an earlier run's metrics and there is no checkpoint to resume from "
            f"({'no [checkpoint] table' if cfg.checkpoint is None else cfg.checkpoint.output_dir}); "
            "pass --fresh to start over (it removes: " + "; ".join(existing) + ")"
        )
    return False


def build_train_run(
    cfg: RunConfig, reducers: dict[str, Any] | None = None, *, resume: bool = False
) -> TrainRun:
    """Everything ``ludic train`` needs, built in dependency order; ``resume`` loads the latest checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    from ludic.cli.pipeline_mode import build_pipeline_mode
    from ludic.distributed import ClientPublisher
    from ludic.training.batching import RolloutBatchSource
    from ludic.training.loggers.dashboard import make_train_logger
    from ludic.training.resume import drop_records_after, resume_latest
    from ludic.training.trainer import Trainer

    torch.manual_seed(cfg.seed)
    out = Path(cfg.logging.output_dir)
    dtype = getattr(torch, cfg.model.dtype)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype).to(cfg.model.device)
    client = make_client(cfg)
    sampling = cfg.rollout.sampling.to_sampling()
    engine = make_engine(cfg, client, sampling)
    algo = make_algorithm(cfg)
    evaluator = make_evaluator(cfg, engine, out / "eval", reducers)
    if cfg.eval.every_n_steps:
        cfg.trainer.eval_every_n_steps = cfg.eval.every_n_steps

    def rollout_source(first_seed: int = cfg.rollout.seed) -> Any:
        requests = GroupedRequests(cfg, sampling)
        requests.next_seed = first_seed
        return RolloutBatchSource(
            engine=engine,
            request_fn=requests,
            algorithm=algo,
            max_steps=cfg.rollout.max_steps,
            concurrency=cfg.rollout.concurrency,
        )

    pipeline = build_pipeline_mode(cfg, ClientPublisher(client)) if cfg.pipeline.enabled else None
    trainer = Trainer(
        model=model,
        algo=algo,
        batch_source=pipeline.batch_source if pipeline else rollout_source(),
        publisher=pipeline.publisher if pipeline else ClientPublisher(client),
        cfg=cfg.trainer,
        checkpoint_config=cfg.checkpoint,
        evaluator=evaluator,
    )
    if resume:  # before the metrics file is opened: records after the checkpoint are dropped
        step = resume_latest(trainer)
        dropped = drop_records_after(out / "metrics.jsonl", step)
        print(f"ludic train: resuming at step {step} of {cfg.steps} from {trainer.checkpointer.output_dir} "
              f"({dropped} metrics records after it dropped)", flush=True)  # fmt: skip
    trainer.train_logger = make_train_logger(out / "metrics.jsonl", total_steps=cfg.steps, live=cfg.logging.rich)
    return TrainRun(
        trainer=trainer, evaluator=evaluator, logger=trainer.train_logger, out_dir=out,
        pipeline=pipeline, client=client, rollout_source=rollout_source,
    )  # fmt: skip


def train_from_config(
    cfg: RunConfig, reducers: dict[str, Any] | None = None, *, fresh: bool = False
) -> dict[str, float]:
    """``ludic train``: train up to ``cfg.steps`` steps, evaluate, plot; returns the final eval stats.

    Resumes from the latest checkpoint unless ``fresh`` (see :func:`plan_start`).
    reducers: extra ``eval/`` statistics (``{name: Reducer}``) for the evaluations.
    """
    return asyncio.run(_train(cfg, reducers, fresh))


async def _train(cfg: RunConfig, reducers: dict[str, Any] | None, fresh: bool) -> dict[str, float]:
    from ludic.cli.pipeline_mode import running_actors
    from ludic.training.batching.pipeline_local import train_alongside
    from ludic.training.loggers.plot import plot_metrics

    run = build_train_run(cfg, reducers, resume=plan_start(cfg, fresh=fresh))
    try:
        with run.logger:
            if run.pipeline is None:
                await run.trainer.train(max(cfg.steps - run.trainer.step, 0))
            else:
                async with running_actors(cfg, run.pipeline, run.client, run.rollout_source) as actors:
                    await train_alongside(run.trainer.train(max(cfg.steps - run.trainer.step, 0)), actors)
    finally:
        if run.pipeline is not None:
            await run.pipeline.batch_source.close()
            run.pipeline.close()
    if run.trainer.checkpointer is not None:
        run.trainer.save_checkpoint()  # the end is resumable too (run again with more steps)
    stats = await run.evaluator.evaluate(step=cfg.steps)
    if cfg.logging.plot:
        plot_metrics(run.out_dir / "metrics.jsonl", run.out_dir / "training_curve.png", title=cfg.source)
    final = run.out_dir / "final_model"
    run.trainer.model.save_pretrained(final)
    _tokenizer(cfg).save_pretrained(final)
    return stats


def _tokenizer(cfg: RunConfig) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(cfg.model.tokenizer or cfg.model.path)


def eval_from_config(cfg: RunConfig, reducers: dict[str, Any] | None = None) -> dict[str, float]:
    """``ludic eval``: play the held-out episodes once with ``[eval].sampling``."""

    async def _eval() -> dict[str, float]:
        client = make_client(cfg)
        engine = make_engine(cfg, client, cfg.eval.sampling.to_sampling())
        out = Path(cfg.logging.output_dir) / "eval"
        return await make_evaluator(cfg, engine, out, reducers).evaluate()

    return asyncio.run(_eval())


def sft_to_dir(
    cfg: RunConfig, items: list[Any], *, steps: int, batch_size: int, lr: float, out_dir: Path
) -> Path:
    """SFT warm start: train ``cfg.model.path`` on SAW ``items`` (``make_sft``), save to ``out_dir``."""
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM

    from ludic.training.batching import OfflineBatchSource
    from ludic.training.presets import make_sft
    from ludic.training.trainer import Trainer

    torch.manual_seed(cfg.seed)
    dtype = getattr(torch, cfg.model.dtype)  # the warm start trains in [model].dtype, as ludic train does
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype).to(cfg.model.device)
    tokenizer = _tokenizer(cfg)
    trainer_cfg = dataclasses.replace(
        cfg.trainer, lr=lr, learning_rate=None, sync_every_steps=0, eval_every_n_steps=None
    )
    source = OfflineBatchSource(items, batch_size=batch_size, shuffle=True, seed=cfg.seed)
    asyncio.run(Trainer(model=model, algo=make_sft(), batch_source=source, cfg=trainer_cfg).train(steps))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
