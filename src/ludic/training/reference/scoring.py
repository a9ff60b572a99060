"""Frozen-model scoring: a reference or teacher model's log-prob of every action token, as a preprocess step.

A ``FrozenModelScorer`` is a ``PreprocessFn``: the Trainer runs it on each macro-batch (after the
filters, so dropped items are never scored) and it attaches ``attachments.frozen_logps[key]`` to every
item; collation turns that into ``batch[key]`` [B, T] for ``TokenKLLoss``. The Trainer never learns
that a second model exists. It plans micro-batches under the token budget exactly as the trainer does
(padding-free packing where the architecture allows it) and takes the log-probs through the trainer's
own path (``forward.micro_batch_token_logps``: from the last hidden states in chunks, no [B, T, V]
logits), under ``torch.no_grad``: the scores are the numbers the policy would give with those weights.
"""

from __future__ import annotations

import copy
from pathlib import Path
from time import perf_counter
from typing import Any

import torch
from torch import nn

from ludic.kernels import CpuKernels, cpu_kernels_setting
from ludic.training.layout.forward import micro_batch_kernels, micro_batch_token_logps
from ludic.training.layout.micro_batch_plan import MicroBatch, plan_micro_batches
from ludic.training.types import SAWBatch, SAWItem

ModelLike = str | Path | nn.Module


class FrozenModelScorer:
    """Scores SAW items' action tokens with a frozen model and attaches them as ``frozen_logps[key]``.

    model: a ``save_pretrained`` directory (loaded with ``AutoModelForCausalLM``) or a loaded module.
        A module is snapshotted (deep-copied) unless ``snapshot=False``, so passing the policy itself
        gives a reference frozen at its current weights rather than one that follows training.
    key: the batch key the loss reads (``"ref_logps"`` for a KL penalty, ``"teacher_logps"`` to distil).
    micro_token_budget: padded tokens per forward (``max_len * count``), as ``TrainerConfig``'s.
    device / dtype: where and in what precision the frozen model runs (default: a module stays where
        it is; a directory loads on CPU in its saved dtype).
    onednn_linears: fp32 on the CPU, run the linear layers through oneDNN (``kernels/cpu/onednn_linear.py``;
        as ``TrainerConfig.onednn_linears``); log-probs equal to fp32 rounding.
    cpu_kernels: the CPU speed-ups' switch, as ``TrainerConfig.cpu_kernels`` (None: ``$LUDIC_CPU_KERNELS``).
    """

    def __init__(
        self,
        model: ModelLike,
        *,
        key: str = "ref_logps",
        micro_token_budget: int = 16384,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        pad_token_id: int = 0,
        snapshot: bool = True,
        onednn_linears: bool = True,
        cpu_kernels: CpuKernels | None = None,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"FrozenModelScorer.key must be a non-empty string, got {key!r}")
        if not isinstance(micro_token_budget, int) or micro_token_budget <= 0:
            raise ValueError(f"FrozenModelScorer.micro_token_budget must be a positive int, got {micro_token_budget!r}")
        self.key = key
        self.micro_token_budget = micro_token_budget
        self.pad_token_id = int(pad_token_id)
        self.onednn_linears = onednn_linears
        self.cpu_kernels = cpu_kernels_setting(cpu_kernels) if cpu_kernels is not None else None
        self.model = _load_frozen(model, device=device, dtype=dtype, snapshot=snapshot)
        self.device = next(self.model.parameters()).device

    def __call__(self, batch: SAWBatch) -> SAWBatch:
        """The preprocess step: score ``batch.items`` in place and return the batch, its meta saying how
        long that took (``time/<key>_seconds``: the Trainer reports it in the step's ``time/`` split)."""
        t0 = perf_counter()
        self.score_items(batch.items)
        batch.meta[f"time/{self.key}_seconds"] = batch.meta.get(f"time/{self.key}_seconds", 0.0) + perf_counter() - t0
        return batch

    def score_items(self, items: list[SAWItem]) -> None:
        """Set ``item.attachments.frozen_logps[self.key]`` (one float per action token) on every item."""
        if not items:
            return
        plain = [_plain(it, i) for i, it in enumerate(items)]
        longest = max(len(it.input_ids) for it in plain)  # nothing is truncated: every action token is scored
        budget = max(self.micro_token_budget, longest)
        mbs = plan_micro_batches(
            self.model, plain, micro_token_budget=budget, max_seq_len=longest, cpu_kernels=self.cpu_kernels
        )
        for mb in mbs:
            for index, values in self._score_micro_batch(mb):
                items[index].attachments.frozen_logps[self.key] = values

    @torch.no_grad()
    def _score_micro_batch(self, mb: MicroBatch) -> list[tuple[int, list[float]]]:
        """(item index, its action tokens' log-probs) for one micro-batch, through the trainer's path."""
        with micro_batch_kernels(self.model, mb, onednn=self.onednn_linears, cpu_kernels=self.cpu_kernels):
            batch, logps = micro_batch_token_logps(self.model, mb, pad_token_id=self.pad_token_id, device=self.device)
        mask = batch["action_mask"].bool()  # [B, T]
        logps = logps.float().cpu()
        mask = mask.cpu()
        return [(it.meta["score_index"], logps[i][mask[i]].tolist()) for i, it in enumerate(mb.items)]


def _plain(item: SAWItem, index: int) -> SAWItem:
    """The item's tokens only, tagged with its index: scoring needs no weight, meta or attachments."""
    return SAWItem(item.input_ids, item.attention_mask, item.action_mask, 0.0, {"score_index": index})


def _load_frozen(
    model: ModelLike, *, device: str | torch.device | None, dtype: torch.dtype | str | None, snapshot: bool
) -> nn.Module:
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"frozen model directory {str(path)!r} has no config.json; give a save_pretrained "
                "directory or a loaded nn.Module"
            )
        from transformers import AutoModelForCausalLM

        kwargs: dict[str, Any] = {} if torch_dtype is None else {"dtype": torch_dtype}
        module = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    elif isinstance(model, nn.Module):
        module = copy.deepcopy(model) if snapshot else model
        if torch_dtype is not None:
            module = module.to(torch_dtype)
    else:
        raise TypeError(
            f"frozen model must be a model directory (str/Path) or an nn.Module, got {type(model).__name__}"
        )
    if device is not None:
        module = module.to(device)
    module.eval()
    module.requires_grad_(False)
    return module
