"""How SAW items become tensors: token-budget micro-batches, packing, prompt-prefix sharing, the forward."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.training.layout.micro_batching import collate_saw_items, split_items_by_token_budget

__all__ = [
    "collate_saw_items",
    "split_items_by_token_budget",
]

__getattr__, __dir__ = lazy_exports(__name__)
