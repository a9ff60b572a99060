"""Frozen-model scoring: a reference or teacher model's log-prob of every action token, as a preprocess step.

A ``FrozenModelScorer`` is a ``PreprocessFn``: the Trainer runs it on each macro-batch (after the
filters, so dropped items are never scored) and it attaches ``attachments.frozen_logps[key]`` to every
item; collation turns that into ``batch[key]`` [B, T] for ``TokenKLLoss``. The Trainer never learns
that a second model exists. It packs items under a token budget like the trainer does, runs the
model under ``torch.no_grad`` and reuses the trainer's own log-prob helper (``compute_token_logps``),
so the scores are the numbers the policy would produce with the same weights.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ludic.training._setup import forward_logits
from ludic.training.batching.micro_batching import collate_saw_items
from ludic.training.loss.base import compute_token_logps
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
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"FrozenModelScorer.key must be a non-empty string, got {key!r}")
        if not isinstance(micro_token_budget, int) or micro_token_budget <= 0:
            raise ValueError(f"FrozenModelScorer.micro_token_budget must be a positive int, got {micro_token_budget!r}")
        self.key = key
        self.micro_token_budget = micro_token_budget
        self.pad_token_id = int(pad_token_id)
        self.model = _load_frozen(model, device=device, dtype=dtype, snapshot=snapshot)
        self.device = next(self.model.parameters()).device

    def __call__(self, batch: SAWBatch) -> SAWBatch:
        """The preprocess step: score ``batch.items`` in place and return the batch."""
        self.score_items(batch.items)
        return batch

    def score_items(self, items: list[SAWItem]) -> None:
        """Set ``item.attachments.frozen_logps[self.key]`` (one float per action token) on every item."""
        for group in pack_by_token_budget([len(it.input_ids) for it in items], self.micro_token_budget):
            mb_items = [items[i] for i in group]
            for item, values in zip(mb_items, self.token_logps(mb_items), strict=True):
                item.attachments.frozen_logps[self.key] = values

    @torch.no_grad()
    def token_logps(self, items: list[SAWItem]) -> list[list[float]]:
        """The frozen model's log-prob of each action token of each item (one forward for all of them)."""
        mb = collate_saw_items(_plain(items), pad_token_id=self.pad_token_id, device=self.device)
        logits = forward_logits(self.model, mb)  # [B, T, V]
        mb_logps = compute_token_logps(logits, mb["input_ids"]).float()  # [B, T], token t scored at t-1
        mask = mb["action_mask"].bool()  # [B, T]
        return [mb_logps[i][mask[i]].tolist() for i in range(len(items))]


def pack_by_token_budget(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices grouped shortest first so that ``max_len * count <= budget`` (a longer item goes alone)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and lengths[i] * (len(current) + 1) > budget:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups


def _plain(items: list[SAWItem]) -> list[SAWItem]:
    """Items stripped of attachments: scoring needs only the tokens (and mixed actor logprobs are fine)."""
    return [
        SAWItem(input_ids=it.input_ids, attention_mask=it.attention_mask, action_mask=it.action_mask, weight=0.0)
        for it in items
    ]


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
