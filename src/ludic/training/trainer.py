"""The Trainer: an algorithm-blind optimisation loop over macro-batches of SAW items.

One step reads in five lines: next batch -> split by token budget -> loss/backward per
micro-batch -> optimizer step -> publish. Everything else lives behind helpers: set-up
(``_setup``), where the step runs (``_step_runner``), staleness, publishing, evaluation and
checkpoints (``_step_hooks``), stats (``stats``) and sharded training (``DataParallelGroup``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from ludic.distributed.interfaces import PolicyPublisher
from ludic.kernels.cpu.threads import CpuThreads
from ludic.kernels.cpu.threads import shared as shared_cpu_threads
from ludic.training import _step_hooks as hooks
from ludic.training._lora import ParamFilter
from ludic.training._setup import (
    build_cfg_scheduler,
    build_optimizer,
    check_optimizer_settings,
    check_publisher,
    prepare_model,
    resolve_pad_token_id,
    seed_everything,
)
from ludic.training._step_runner import StepRunner
from ludic.training._step_times import StepClock, without_times
from ludic.training.algorithm import RLAlgorithm
from ludic.training.config import CheckpointConfig, TrainerConfig
from ludic.training.layout.forward import micro_batch_kernels, micro_batch_loss
from ludic.training.layout.micro_batch_plan import MicroBatch, plan_micro_batches
from ludic.training.layout.token_arrays import attended_tokens, num_action_tokens
from ludic.training.loggers.base import TrainingLogger
from ludic.training.parallel.checkpoint import make_checkpointer
from ludic.training.parallel.step import DataParallelGroup
from ludic.training.stats import MicroBatchWeight, Reducer, StatWeight, default_reducers, step_batch_stats
from ludic.training.types import BatchSource, SAWBatch

if TYPE_CHECKING:
    from ludic.eval.protocol import PolicyEvaluator


class Trainer:
    """Optimises ``model`` with ``algo`` on batches from ``batch_source``; see TrainerConfig for knobs.

    ``param_filter(name, tensor) -> bool`` selects what is published; ``evaluator.evaluate(concurrency=)``
    returns ``eval/``-prefixed floats; ``train_logger`` follows ``TrainingLogger`` (``log(step, stats)``).
    ``optimizer`` defaults to AdamW built from ``cfg.lr/weight_decay/betas`` (a given optimizer with
    any of those set in ``cfg`` is refused); ``lr_scheduler`` defaults to ``cfg.lr_schedule``.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        algo: RLAlgorithm,
        batch_source: BatchSource,
        publisher: PolicyPublisher | None = None,
        cfg: TrainerConfig | None = None,
        train_logger: TrainingLogger | None = None,
        reducers: Mapping[str, Reducer] | None = None,
        checkpoint_config: CheckpointConfig | None = None,
        param_filter: ParamFilter | None = None,
        evaluator: PolicyEvaluator | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: LRScheduler | None = None,
    ) -> None:
        self.cfg = cfg = cfg if cfg is not None else TrainerConfig()
        check_publisher(cfg, publisher)
        check_optimizer_settings(cfg, optimizer, lr_scheduler)
        seed_everything(cfg.seed)
        self.ranks = DataParallelGroup.for_model(model)  # one process: every hook is the identity
        self.model = prepare_model(model, cfg, sharded=self.ranks.active)
        self.algo = algo
        self.batch_source = batch_source
        self.publisher = publisher
        self.train_logger = train_logger
        self.reducers = dict(reducers) if reducers is not None else default_reducers()
        self.checkpointer = make_checkpointer(checkpoint_config, model) if checkpoint_config else None
        self.param_filter = param_filter
        self.evaluator = evaluator
        self.optimizer = optimizer if optimizer is not None else build_optimizer(self.model, cfg)
        self.lr_scheduler = lr_scheduler if lr_scheduler is not None else build_cfg_scheduler(self.optimizer, cfg)
        self.pad_token_id = resolve_pad_token_id(self.model, cfg)
        self.step = 0
        self._runner = StepRunner(in_thread=cfg.step_in_thread)  # the sync wrappers' loop, the step's thread

    # ---- the loop -----------------------------------------------------------------------------
    async def train(self, num_steps: int | None = None) -> list[dict[str, float]]:
        """Run ``num_steps`` steps (None: until the batch source raises StopAsyncIteration).

        Returns the stats of every step run, in order (``history[-1]`` is the last step's).
        """
        history: list[dict[str, float]] = []
        while num_steps is None or len(history) < num_steps:
            try:
                history.append(await self.train_step())
            except StopAsyncIteration:
                if num_steps is None:
                    break
                raise
        return history

    async def train_step(self) -> dict[str, float]:
        """One optimizer step; returns flat ``train/``, ``perf/``, ``time/`` (and ``eval/``) stats.

        ``time/*_seconds`` split the step's wall time (``time/step_seconds``): see ``_step_times``."""
        with self.ranks.step_scope(self.step + 1):  # a collective failing unnamed is named by its step
            return await self._train_step()

    async def _train_step(self) -> dict[str, float]:
        clock = StepClock()
        batch = await self.batch_source.next_batch()
        clock.source_parts(batch.meta, perf_counter() - clock.start)
        batch = SAWBatch(items=batch.items, meta=without_times(batch.meta))
        stats, token_stats, train_seconds = await self._runner.off_loop(self._learn, batch, clock)
        if token_stats is None:  # nothing to learn from after filtering: no step taken
            return self._log(stats | clock.stats())
        with clock.part("eval"):
            stats.update(await hooks.evaluate_if_due(self))
        stats.update(self.ranks.perf_stats(token_stats, train_seconds))  # tokens/s: forward-backward + optimizer
        with clock.part("checkpoint"):
            await hooks.checkpoint_if_due(self, stats)
        stats.update(clock.stats())
        stats["perf/step_seconds"] = stats["time/step_seconds"]
        # the share of the step spent waiting for data (overlap: 0 = the source always had a batch ready)
        stats["perf/wait_fraction"] = stats.get("time/wait_seconds", 0.0) / max(stats["time/step_seconds"], 1e-9)
        return self._log(stats)

    def _learn(
        self, batch: SAWBatch, clock: StepClock
    ) -> tuple[dict[str, float], dict[str, float] | None, float]:
        """The step's compute: preprocess, micro-batches, backward, optimizer step, publish.

        Returns (stats, token stats, forward-backward + optimizer seconds); token stats are None when
        filtering left nothing to learn. Runs on the step's thread, whose intra-op threads follow the
        cores free now (``ludic.kernels.cpu.threads``).
        """
        cpu = shared_cpu_threads() if torch.device(self.cfg.model_device).type == "cpu" else None
        with cpu.computing() if cpu is not None else contextlib.nullcontext():
            return self._learn_batch(batch, clock, cpu)

    def _learn_batch(
        self, batch: SAWBatch, clock: StepClock, cpu: CpuThreads | None
    ) -> tuple[dict[str, float], dict[str, float] | None, float]:
        with clock.part("preprocess"):  # the algorithm's preprocessing: filters, reference/old log-probs
            batch, drop_stats = self._prepare(batch)
        clock.nested_parts(batch.meta, within="preprocess")  # e.g. a reference scorer's own time
        batch = SAWBatch(items=batch.items, meta=without_times(batch.meta))
        items = batch.items
        if not items:  # e.g. filter_zvp dropped every group: nothing to learn, no step taken
            return {f"train/{k}": v for k, v in drop_stats.items()} | {"train/empty_after_filter": 1.0}, None, 0.0
        t_train = perf_counter()
        if cpu is not None:
            cpu.fit()
        micro_batches = self.ranks.plan(items, lambda share: plan_micro_batches(
            self.model, share, micro_token_budget=self.cfg.micro_token_budget,
            max_seq_len=self.cfg.max_seq_len, pack=self.cfg.pack_sequences,
            share_prompt_prefix=self.cfg.share_prompt_prefix, block_attention=self.cfg.block_attention,
            cpu_kernels=self.cfg.cpu_kernels, keep_head_logits=self.cfg.keep_head_logits,
        ))  # fmt: skip
        with clock.part("forward_backward"):
            loss_stats, token_stats, loss_sum = self._accumulate_gradients(micro_batches, macro_size=len(items), cpu=cpu)
        with clock.part("optimizer"):
            step_stats = self._optimizer_step(loss_sum)
        train_seconds = perf_counter() - t_train
        self.step += 1
        used = self.ranks.used_items(items, [it for mb in micro_batches for it in mb.items], self.cfg.max_seq_len)
        stats = {**loss_stats, **drop_stats, **step_stats, **step_batch_stats(batch.meta, used, self.reducers)}
        stats = {f"train/{k}": v for k, v in stats.items()}
        with clock.part("publish"):
            stats.update(hooks.publish_if_due(self))
        return stats, token_stats, train_seconds

    def _log(self, stats: dict[str, float]) -> dict[str, float]:
        if self.train_logger is not None and self.ranks.is_main and self.step % self.cfg.log_every == 0:
            self.train_logger.log(self.step, stats)
        return stats

    def _prepare(self, batch: SAWBatch) -> tuple[SAWBatch, dict[str, float]]:
        """Preprocess (the Trainer is the one place that runs ``algo.preprocess``) and drop stale items."""
        if not batch.items:
            raise ValueError(
                f"{type(self.batch_source).__name__}.next_batch() returned an empty batch at step "
                f"{self.step + 1}; a batch source must yield at least one SAWItem"
            )
        if self.algo.preprocess is not None:
            batch = self.algo.preprocess(batch)
        items, stats = hooks.drop_stale(list(batch.items), self.step, self.cfg.max_lag)
        return SAWBatch(items=items, meta=batch.meta), stats

    def _accumulate_gradients(
        self, micro_batches: list[MicroBatch], *, macro_size: int, cpu: CpuThreads | None = None
    ) -> tuple[dict[str, float], dict[str, float], torch.Tensor]:
        """Backward every micro-batch, each scaled by ``mb_size / macro_size``.

        Every loss is a per-sequence mean, so sum_mb (mb_size / macro_size) * mean_mb(loss) is the
        mean over the whole macro-batch: the gradient does not depend on how the batch was split.
        Stats average likewise: per-sequence ones by items, token means by action tokens.
        """
        self.optimizer.zero_grad(set_to_none=True)
        device = torch.device(self.cfg.model_device)
        loss_sum = torch.zeros((), device=device)
        mb_stats: list[Mapping[str, Any]] = []
        weights: list[StatWeight] = []
        real = padded = distinct = 0
        for i, mb in enumerate(micro_batches):
            if cpu is not None:
                cpu.fit()
            with (
                self.ranks.grad_sync(self.model, last=i == len(micro_batches) - 1),
                micro_batch_kernels(self.model, mb, onednn=self.cfg.onednn_linears, cpu_kernels=self.cfg.cpu_kernels),
            ):
                mb_loss, stats, computed = micro_batch_loss(
                    self.model, self.algo.loss, mb, pad_token_id=self.pad_token_id, device=device
                )
                mb_scale = self.ranks.share_of(mb, len(mb.items), macro_size)  # 0: a rank-padding repeat
                (mb_loss * (mb_scale * self.ranks.grad_scale)).backward()
            if not mb_scale:  # a zero-weight repeat keeping ranks in step: no stats
                continue
            loss_sum = loss_sum + mb_loss.detach().float() * mb_scale
            mb_stats.append({"loss": mb_loss.detach(), **stats})
            n_action = sum(num_action_tokens(it) for it in mb.items)  # token means are weighted by these
            weights.append(MicroBatchWeight.of(stats, items=len(mb.items), action_tokens=n_action))
            real += sum(attended_tokens(it) for it in mb.items)
            padded += computed
            distinct += token_positions(mb)
        loss_stats = self.ranks.aggregate(mb_stats, weights)
        n_real = float(real)
        token_stats = {
            "real_tokens": n_real,
            "computed_tokens": float(padded),  # positions the forward ran (fewer than real with shared prompts)
            "distinct_tokens": float(distinct),  # of those, the ones holding a token (a shared prompt once)
            "padding_fraction": (padded - distinct) / padded if padded else 0.0,  # of those, padding: in [0, 1)
            "num_micro_batches": float(len(micro_batches)),
        }
        return loss_stats, token_stats, self.ranks.sum(loss_sum)

    def _optimizer_step(self, loss_sum: torch.Tensor) -> dict[str, float]:
        """Clip and step, unless the loss or gradient norm is NaN/inf: then skip (weights stay finite)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grad_norm = self.ranks.total_norm(grads)
        loss_ok, norm_ok = torch.isfinite(torch.stack([loss_sum.cpu(), grad_norm.float().cpu()])).tolist()
        stats = {"grad_norm": float(grad_norm), "lr": float(self.optimizer.param_groups[0]["lr"])}
        if not (loss_ok and norm_ok):
            self.optimizer.zero_grad(set_to_none=True)
            return {**stats, "nonfinite_skipped": 1.0}
        if self.cfg.max_grad_norm is not None:
            params = [p for p in self.model.parameters() if p.grad is not None]
            torch.nn.utils.clip_grads_with_norm_(params, self.cfg.max_grad_norm, grad_norm)
        self.optimizer.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {**stats, "nonfinite_skipped": 0.0}

    # ---- checkpoints and sync wrappers ----------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Write a checkpoint for the current step now (needs ``checkpoint_config``)."""
        return hooks.save_checkpoint(self)

    def load_checkpoint(
        self, *, step: int | None = None, path: str | Path | None = None, fallback: bool = False
    ) -> dict[str, Any]:
        """Restore model, optimizer, scheduler, RNG, step and batch source position (latest by default).

        Atomic: a checkpoint that fails to load changes nothing; ``fallback=True`` then loads the
        previous complete one (``CheckpointManager.load``).
        """
        return hooks.load_checkpoint(self, step=step, path=path, fallback=fallback)

    def train_sync(self, num_steps: int | None = None) -> list[dict[str, float]]:
        return self._runner.run(self.train(num_steps))

    def train_step_sync(self) -> dict[str, float]:
        return self._runner.run(self.train_step())

    def close(self) -> None:
        """Close the private event loop of the sync wrappers (pending tasks, such as a batch source's
        read-ahead, are cancelled and finish first) and the step's worker thread."""
        self._runner.close()


def token_positions(mb: MicroBatch) -> int:
    """Positions of ``mb``'s forward that hold a token (packed: each shared prompt once), padding excluded."""
    if mb.plan is not None:
        return sum(seg.length for row in mb.plan.rows for seg in row)
    return sum(len(it.input_ids) for it in mb.items)
