"""The Trainer: an algorithm-blind optimisation loop over macro-batches of SAW items.

One step reads in five lines: next batch -> split by token budget -> loss/backward per
micro-batch -> optimizer step -> publish. Everything else (set-up, LoRA export, stats, logging,
checkpoints) lives behind helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from time import perf_counter
from typing import Any, TypeVar

import torch
from torch import nn

from ludic.distributed.interfaces import PolicyPublisher
from ludic.training._lora import ParamFilter
from ludic.training._setup import (
    build_cfg_scheduler,
    build_optimizer,
    check_optimizer_settings,
    enable_gradient_checkpointing,
    resolve_pad_token_id,
    seed_everything,
)
from ludic.training.algorithm import RLAlgorithm
from ludic.training.batching.token_arrays import attended_tokens
from ludic.training.config import CheckpointConfig, TrainerConfig
from ludic.training.distributed_checkpoint import make_checkpointer
from ludic.training.distributed_publish import gather_publishable
from ludic.training.distributed_step import DataParallelGroup
from ludic.training.forward import MicroBatch, micro_batch_kernels, micro_batch_loss, plan_micro_batches
from ludic.training.loggers.base import TrainingLogger
from ludic.training.loggers.prefix import GROUPS
from ludic.training.stats import (
    Reducer,
    apply_reducers_to_records,
    batch_summary,
    default_reducers,
    staleness_stats,
)
from ludic.training.types import BatchSource, SAWBatch, SAWItem

T = TypeVar("T")


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
        evaluator: Any = None,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
    ) -> None:
        self.cfg = cfg = cfg if cfg is not None else TrainerConfig()
        if publisher is None and cfg.sync_explicit and cfg.sync_every_steps > 0:
            raise ValueError(
                f"TrainerConfig.sync_every_steps={cfg.sync_every_steps} but no publisher was given; pass "
                "publisher=ClientPublisher(client) (ludic.distributed) or set sync_every_steps=0"
            )
        if cfg.seed is not None:
            seed_everything(cfg.seed)
        self.ranks = DataParallelGroup.for_model(model)  # one process: every hook is the identity
        self.model = model if self.ranks.active else model.to(cfg.model_device)
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        self.model.train()
        self.algo = algo
        self.batch_source = batch_source
        self.publisher = publisher
        self.train_logger = train_logger
        self.reducers = dict(reducers) if reducers is not None else default_reducers()
        self.checkpointer = make_checkpointer(checkpoint_config, model) if checkpoint_config else None
        self.param_filter = param_filter
        self.evaluator = evaluator
        self.optimizer = optimizer if optimizer is not None else build_optimizer(self.model, cfg)
        check_optimizer_settings(cfg, optimizer, lr_scheduler)
        self.lr_scheduler = lr_scheduler if lr_scheduler is not None else build_cfg_scheduler(self.optimizer, cfg)
        self.pad_token_id = resolve_pad_token_id(self.model, cfg)
        self.step = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: ThreadPoolExecutor | None = None  # cfg.step_in_thread: the step's compute runs here

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
        """One optimizer step; returns flat ``train/``, ``perf/`` (and ``eval/``) stats."""
        t0 = perf_counter()
        batch = await self.batch_source.next_batch()
        stats, token_stats, train_seconds = await self._off_loop(self._learn, batch, t0)
        if token_stats is None:  # nothing to learn from after filtering: no step taken
            return self._log(stats)
        stats.update(await self._maybe_evaluate())
        stats["perf/step_seconds"] = perf_counter() - t0
        stats.update(self.ranks.perf_stats(token_stats, train_seconds))  # tokens/s excludes eval
        await self._maybe_checkpoint(stats)
        return self._log(stats)

    def _learn(
        self, batch: SAWBatch, t0: float
    ) -> tuple[dict[str, float], dict[str, float] | None, float]:
        """The step's compute: preprocess, micro-batches, backward, optimizer step, publish.

        Returns (stats, token stats, seconds); token stats are None when filtering left nothing to learn.
        """
        batch, drop_stats = self._prepare(batch)
        items = batch.items
        if not items:  # e.g. filter_zvp dropped every group: nothing to learn, no step taken
            return {f"train/{k}": v for k, v in drop_stats.items()} | {"train/empty_after_filter": 1.0}, None, 0.0
        micro_batches = self.ranks.plan(items, lambda share: plan_micro_batches(
            self.model, share, micro_token_budget=self.cfg.micro_token_budget,
            max_seq_len=self.cfg.max_seq_len, pack=self.cfg.pack_sequences,
            share_prompt_prefix=self.cfg.share_prompt_prefix, block_attention=self.cfg.block_attention,
        ))  # fmt: skip
        loss_stats, token_stats, loss_sum = self._accumulate_gradients(micro_batches, macro_size=len(items))
        step_stats = self._optimizer_step(loss_sum)
        train_seconds = perf_counter() - t0
        self.step += 1
        stats = {**loss_stats, **drop_stats, **step_stats}
        used = [it for mb in micro_batches for it in mb.items]
        stats.update(self._batch_stats(batch, self.ranks.used_items(items, used, self.cfg.max_seq_len)))
        stats = {f"train/{k}": v for k, v in stats.items()}
        stats.update(self._maybe_publish())
        return stats, token_stats, train_seconds

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` here, or with ``cfg.step_in_thread`` on the Trainer's one worker thread while the
        event loop serves others (actor tasks, the embedded engine). A cancelled step still finishes
        before the cancellation propagates, so the model, optimizer and step count stay consistent."""
        if not self.cfg.step_in_thread:
            return fn(*args)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-trainer")
        future = asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await future
            raise

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
        items = list(batch.items)
        stats: dict[str, float] = {}
        stats.update(staleness_stats(items, self.step))
        if self.cfg.max_lag is not None:
            fresh = [it for it in items if not self._is_stale(it)]
            stats["stale_items_dropped"] = float(len(items) - len(fresh))
            items = fresh
        return SAWBatch(items=items, meta=batch.meta), stats

    def _is_stale(self, item: SAWItem) -> bool:
        version = item.meta.get("policy_version")
        return isinstance(version, int) and self.step - version > self.cfg.max_lag  # type: ignore[operator]

    def _accumulate_gradients(
        self, micro_batches: list[MicroBatch], *, macro_size: int
    ) -> tuple[dict[str, float], dict[str, float], torch.Tensor]:
        """Backward every micro-batch, each scaled by ``mb_size / macro_size``.

        Every loss is a per-sequence mean, so sum_mb (mb_size / macro_size) * mean_mb(loss) is the
        mean over the whole macro-batch: the gradient does not depend on how the batch was split.
        """
        self.optimizer.zero_grad(set_to_none=True)
        device = torch.device(self.cfg.model_device)
        loss_sum = torch.zeros((), device=device)
        real = 0
        mb_stats_list: list[dict[str, Any]] = []
        weights: list[float] = []
        padded = 0
        for i, mb in enumerate(micro_batches):
            mb_items = mb.items
            with (
                self.ranks.grad_sync(self.model, last=i == len(micro_batches) - 1),
                micro_batch_kernels(self.model, mb, onednn=self.cfg.onednn_linears),
            ):
                mb_loss, mb_stats, computed = micro_batch_loss(
                    self.model, self.algo.loss, mb, pad_token_id=self.pad_token_id, device=device
                )
                mb_scale = self.ranks.share_of(mb, len(mb_items), macro_size)
                (mb_loss * (mb_scale * self.ranks.grad_scale)).backward()
            if not mb_scale:  # a zero-weight repeat keeping ranks in step: no stats
                continue
            loss_sum = loss_sum + mb_loss.detach().float() * mb_scale
            real += sum(attended_tokens(it) for it in mb_items)
            padded += computed
            mb_stats_list.append({"loss": mb_loss.detach(), **dict(mb_stats)})
            weights.append(float(len(mb_items)))
            del mb_loss
        loss_stats = self.ranks.aggregate(mb_stats_list, weights)
        loss_sum = self.ranks.sum(loss_sum)
        n_real = float(real)
        token_stats = {
            "real_tokens": n_real,
            "padded_tokens": float(padded),  # positions the forward ran (fewer than real with shared prompts)
            "padding_efficiency": n_real / padded if padded else 0.0,
            "num_micro_batches": float(len(micro_batches)),
        }
        return loss_stats, token_stats, loss_sum

    def _optimizer_step(self, loss_sum: torch.Tensor) -> dict[str, float]:
        """Clip and step, unless the loss or gradient norm is NaN/inf: then skip (weights stay finite)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grad_norm = self.ranks.total_norm(grads)
        loss_ok, norm_ok = torch.isfinite(torch.stack([loss_sum.cpu(), grad_norm.float().cpu()])).tolist()
        stats = {"grad_norm": float(grad_norm), "lr": float(self.optimizer.param_groups[0]["lr"])}
        if not (loss_ok and norm_ok):
            self.optimizer.zero_grad(set_to_none=True)
            stats["nonfinite_skipped"] = 1.0
            return stats
        if self.cfg.max_grad_norm is not None:
            params = [p for p in self.model.parameters() if p.grad is not None]
            torch.nn.utils.clip_grads_with_norm_(params, self.cfg.max_grad_norm, grad_norm)
        self.optimizer.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats["nonfinite_skipped"] = 0.0
        return stats

    def _batch_stats(self, batch: SAWBatch, used: list[SAWItem]) -> dict[str, float]:
        meta = {
            k: float(v)
            for k, v in batch.meta.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        return {**meta, **batch_summary(used, batch.meta), **apply_reducers_to_records(used, self.reducers)}

    # ---- after the step -------------------------------------------------------------------------
    def _maybe_publish(self) -> dict[str, float]:
        every = self.cfg.sync_every_steps or 0
        if self.publisher is None or every <= 0 or self.step % every != 0:
            return {}
        t0 = perf_counter()
        state = gather_publishable(self.model, self.param_filter)  # sharded: layer by layer, {} off rank 0
        stats = {}
        if self.ranks.is_main:
            self.publisher.publish(state, version=self.step)
            # a publisher may report numbers of its own (bytes sent, the sync probe's gap)
            own = getattr(self.publisher, "last_stats", None) or {}
            stats = {f"perf/{k}": float(v) for k, v in own.items()}
        return {"perf/publish_seconds": perf_counter() - t0, **stats}

    async def _maybe_evaluate(self) -> dict[str, float]:
        every = self.cfg.eval_every_n_steps
        if self.evaluator is None or not every or self.step % every != 0:
            return {}
        result = self.evaluator.evaluate(concurrency=self.cfg.eval_concurrency)
        if inspect.isawaitable(result):
            result = await result
        return {_eval_key(k): float(v) for k, v in result.items()}

    async def _maybe_checkpoint(self, stats: Mapping[str, float]) -> None:
        """Save when due; a batch source with ``state_dict`` (a stream cursor) is saved alongside, and
        told once the checkpoint is on disk (``on_checkpoint_saved``: e.g. trim what it covers)."""
        if self.checkpointer is None:
            return
        source_state = _source_state(self.batch_source)
        metadata: dict[str, Any] = {"stats": dict(stats)}
        if source_state is not None:
            metadata["batch_source"] = source_state
        saved = self.checkpointer.maybe_save(
            self.model, self.optimizer, step=self.step, scheduler=self.lr_scheduler,
            metadata=metadata, config=asdict(self.cfg),
        )  # fmt: skip
        on_saved = getattr(self.batch_source, "on_checkpoint_saved", None)
        if saved is not None and source_state is not None and on_saved is not None:
            result = on_saved(source_state)
            if inspect.isawaitable(result):
                await result

    # ---- checkpoints and sync wrappers ----------------------------------------------------------
    def save_checkpoint(self) -> Any:
        """Write a checkpoint for the current step now (needs ``checkpoint_config``)."""
        if self.checkpointer is None:
            raise ValueError(
                "save_checkpoint needs Trainer(checkpoint_config=CheckpointConfig(output_dir=...))"
            )
        source_state = _source_state(self.batch_source)
        metadata = {} if source_state is None else {"batch_source": source_state}
        return self.checkpointer.save(
            self.model, self.optimizer, step=self.step, scheduler=self.lr_scheduler,
            metadata=metadata, config=asdict(self.cfg),
        )  # fmt: skip

    def load_checkpoint(
        self, *, step: int | None = None, path: Any = None, fallback: bool = False
    ) -> dict[str, Any]:
        """Restore model, optimizer, scheduler, RNG, step and batch source position (latest by default).

        Atomic: a checkpoint that fails to load changes nothing; ``fallback=True`` then loads the
        previous complete one (``CheckpointManager.load``).
        """
        if self.checkpointer is None:
            raise ValueError(
                "load_checkpoint needs Trainer(checkpoint_config=CheckpointConfig(output_dir=...))"
            )
        state = self.checkpointer.load(
            self.model, self.optimizer, step=step, path=path, scheduler=self.lr_scheduler, fallback=fallback
        )
        self.step = int(state["step"])
        source_state = state.get("metadata", {}).get("batch_source")
        if source_state is not None and hasattr(self.batch_source, "load_state_dict"):
            self.batch_source.load_state_dict(source_state)  # e.g. the stream cursor: no repeat, no skip
        return state

    def _run(self, coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError(
                "train_sync/train_step_sync called inside an event loop; use `await trainer.train(...)`"
            )
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()  # one loop for all sync calls: async sources keep state
        return self._loop.run_until_complete(coro)

    def train_sync(self, num_steps: int | None = None) -> list[dict[str, float]]:
        return self._run(self.train(num_steps))

    def train_step_sync(self) -> dict[str, float]:
        return self._run(self.train_step())

    def close(self) -> None:
        """Close the private event loop used by the sync wrappers, and the step's worker thread. Tasks still
        pending on that loop (a batch source's read-ahead) are cancelled and run to their end first, as
        ``asyncio.run`` does, so their clean-up runs while the loop is still there."""
        if self._loop is not None and not self._loop.is_closed():
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None


def _source_state(source: BatchSource) -> dict[str, Any] | None:
    state_dict = getattr(source, "state_dict", None)
    return dict(state_dict()) if callable(state_dict) else None


def _eval_key(key: str) -> str:
    """Evaluator keys belong under ``eval/`` unless they already name a group (``perf/eval_seconds``)."""
    if key.split("/", 1)[0] in GROUPS and "/" in key:
        return key
    return f"eval/{key.removeprefix('eval_')}"
