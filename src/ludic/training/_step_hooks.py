"""What the Trainer does around a step when a feature asks for it, kept out of its loop.

Before the step: drop items sampled by a policy too old (``max_lag``). After it: publish the weights
(``sync_every_steps``), evaluate (``eval_every_n_steps``) and checkpoint (``CheckpointConfig``), the
batch source's position saved alongside. Each hook is a no-op when its feature is off.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict
from pathlib import Path
from time import perf_counter
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ludic.distributed.lora_payload import lora_publish_mode
from ludic.training.loggers.prefix import GROUPS
from ludic.training.parallel.publish import gather_publishable
from ludic.training.stats import staleness_stats
from ludic.training.types import BatchSource, SAWItem

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ludic.training.trainer import Trainer


def drop_stale(items: list[SAWItem], step: int, max_lag: int | None) -> tuple[list[SAWItem], dict[str, float]]:
    """(items, stats): staleness stats, and with ``max_lag`` the items whose ``meta["policy_version"]``
    lags ``step`` by more than that dropped (``stale_items_dropped``)."""
    stats = staleness_stats(items, step)
    if max_lag is None:
        return items, stats
    fresh = [it for it in items if not _is_stale(it, step, max_lag)]
    return fresh, {**stats, "stale_items_dropped": float(len(items) - len(fresh))}


def _is_stale(item: SAWItem, step: int, max_lag: int) -> bool:
    version = item.meta.get("policy_version")
    return isinstance(version, int) and step - version > max_lag


def publish_if_due(trainer: Trainer) -> dict[str, float]:
    """Publish every ``sync_every_steps``: ``perf/publish_seconds`` plus the publisher's ``last_stats``
    (bytes sent, the sync probe's gap) under ``perf/``."""
    every = trainer.cfg.sync_every_steps or 0
    if trainer.publisher is None or every <= 0 or trainer.step % every != 0:
        return {}
    t0 = perf_counter()
    mode = lora_publish_mode(trainer.publisher)  # a peft model: its adapter alone, or merged weights
    state = gather_publishable(trainer.model, trainer.param_filter, publish=mode)  # sharded: {} off rank 0
    if getattr(state, "config", None) is None:  # full weights (an adapter payload has no ties to drop)
        state = each_tensor_once(state, trainer.model)
    stats = {}
    if trainer.ranks.is_main:
        trainer.publisher.publish(state, version=trainer.step)
        own = getattr(trainer.publisher, "last_stats", None) or {}
        stats = {f"perf/{k}": float(v) for k, v in own.items()}
    return {"perf/publish_seconds": perf_counter() - t0, **stats}


def each_tensor_once(state: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """``state`` less the names tied to an earlier one (a tied ``lm_head.weight`` is the embedding): each
    tensor is sent once (a tied 135M model's embedding was sent twice: 651 MB for 538 MB of weights). The
    receiver's model has the same tie (same config), so loading the one name sets both (the receivers assign
    into the shared parameter). Ties are read from the model's parameters (a sharded model's gathered
    tensors no longer share storage) and from shared storage in ``state`` itself."""
    alias_of: dict[str, str] = {}
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        key = _published_name(name)
        alias_of[key] = first.setdefault(id(param), key)
    out: dict[str, torch.Tensor] = {}
    seen: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
    for name, tensor in state.items():
        primary = alias_of.get(name, name)
        if primary != name and primary in state:
            continue  # its tie-mate is sent
        view = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        if tensor.numel() and tensor.device.type != "meta" and view in seen:
            continue  # the very same memory as a tensor already sent
        seen[view] = name
        out[name] = tensor
    return out


def _published_name(name: str) -> str:
    """A parameter's name as ``merged_state_dict`` publishes it (a peft model's base names)."""
    name = name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")


async def evaluate_if_due(trainer: Trainer) -> dict[str, float]:
    """The evaluator's stats every ``eval_every_n_steps``, keyed under ``eval/``."""
    every = trainer.cfg.eval_every_n_steps
    if trainer.evaluator is None or not every or trainer.step % every != 0:
        return {}
    evaluate = trainer.evaluator.evaluate
    step = {"step": trainer.step} if takes_keyword(evaluate, "step") else {}  # files named by the step
    result = evaluate(concurrency=trainer.cfg.eval_concurrency, **step)
    if inspect.isawaitable(result):
        result = await result
    return {eval_key(k): float(v) for k, v in result.items()}


def takes_keyword(fn: Any, name: str) -> bool:
    """``fn`` accepts keyword ``name`` (named, or ``**kwargs``); False where its signature cannot be read."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any((p.name == name and p.kind != p.POSITIONAL_ONLY) or p.kind == p.VAR_KEYWORD for p in params)


def eval_key(key: str) -> str:
    """Evaluator keys belong under ``eval/`` unless they already name a group (``perf/eval_seconds``)."""
    if key.split("/", 1)[0] in GROUPS and "/" in key:
        return key
    return f"eval/{key.removeprefix('eval_')}"


async def checkpoint_if_due(trainer: Trainer, stats: Mapping[str, float]) -> None:
    """Save when due; a batch source with ``state_dict`` (a stream cursor) is saved alongside, and told
    once the checkpoint is on disk (``on_checkpoint_saved``: e.g. trim what it covers)."""
    if trainer.checkpointer is None:
        return
    source_state = source_position(trainer.batch_source)
    metadata: dict[str, Any] = {"stats": dict(stats)}
    if source_state is not None:
        metadata["batch_source"] = source_state
    saved = trainer.checkpointer.maybe_save(
        trainer.model, trainer.optimizer, step=trainer.step, scheduler=trainer.lr_scheduler,
        metadata=metadata, config=asdict(trainer.cfg),
    )  # fmt: skip
    on_saved = getattr(trainer.batch_source, "on_checkpoint_saved", None)
    if saved is not None and source_state is not None and on_saved is not None:
        result = on_saved(source_state)
        if inspect.isawaitable(result):
            await result


def save_checkpoint(trainer: Trainer) -> Path:
    """Write a checkpoint for the current step now, with the batch source's position."""
    if trainer.checkpointer is None:
        raise ValueError("save_checkpoint needs Trainer(checkpoint_config=CheckpointConfig(output_dir=...))")
    source_state = source_position(trainer.batch_source)
    metadata = {} if source_state is None else {"batch_source": source_state}
    return trainer.checkpointer.save(
        trainer.model, trainer.optimizer, step=trainer.step, scheduler=trainer.lr_scheduler,
        metadata=metadata, config=asdict(trainer.cfg),
    )  # fmt: skip


def load_checkpoint(
    trainer: Trainer, *, step: int | None, path: str | Path | None, fallback: bool
) -> dict[str, Any]:
    """Restore model, optimizer, scheduler, RNG, step and the batch source's position (atomic)."""
    if trainer.checkpointer is None:
        raise ValueError("load_checkpoint needs Trainer(checkpoint_config=CheckpointConfig(output_dir=...))")
    state = trainer.checkpointer.load(
        trainer.model, trainer.optimizer, step=step, path=path, scheduler=trainer.lr_scheduler, fallback=fallback
    )
    trainer.step = int(state["step"])
    source_state = state.get("metadata", {}).get("batch_source")
    if source_state is not None and hasattr(trainer.batch_source, "load_state_dict"):
        trainer.batch_source.load_state_dict(source_state)  # e.g. the stream cursor: no repeat, no skip
    return state


def source_position(source: BatchSource) -> dict[str, Any] | None:
    """The batch source's ``state_dict()`` (its position), or None for a source without one."""
    state_dict = getattr(source, "state_dict", None)
    return dict(state_dict()) if callable(state_dict) else None
