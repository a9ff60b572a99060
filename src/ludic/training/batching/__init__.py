"""From requests to SAW batches: request strategies, the rollout engine, batch sources, SAW builders, JSONL."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.training.batching.jsonl import (
        iter_jsonl,
        rollout_from_dict,
        rollout_to_dict,
        saw_item_from_dict,
        saw_item_to_dict,
    )
    from ludic.training.batching.offline_batch_source import OfflineBatchSource
    from ludic.training.batching.request_sources import (
        Curriculum,
        DatasetRequests,
        requests_from_dataset,
        requests_from_queue,
    )
    from ludic.training.batching.requests import (
        GRPORequestStrategy,
        IdentityRequestStrategy,
        RequestStrategy,
        derive_seed,
        request_from_dict,
        request_to_dict,
    )
    from ludic.training.batching.rollout_batch_source import RolloutBatchSource
    from ludic.training.batching.rollout_engine import EpisodeFailuresError, RolloutEngine
    from ludic.training.batching.saw_builder import (
        prompt_completion_item,
        rollouts_to_saw_items,
        step_to_saw_item,
        step_to_saw_items,
    )
    from ludic.training.batching.sft_data import end_of_turn_id, sft_item, sft_items

__all__ = [
    "Curriculum",
    "DatasetRequests",
    "EpisodeFailuresError",
    "GRPORequestStrategy",
    "IdentityRequestStrategy",
    "OfflineBatchSource",
    "RequestStrategy",
    "RolloutBatchSource",
    "RolloutEngine",
    "derive_seed",
    "end_of_turn_id",
    "iter_jsonl",
    "prompt_completion_item",
    "request_from_dict",
    "request_to_dict",
    "requests_from_dataset",
    "requests_from_queue",
    "rollout_from_dict",
    "rollout_to_dict",
    "rollouts_to_saw_items",
    "saw_item_from_dict",
    "saw_item_to_dict",
    "sft_item",
    "sft_items",
    "step_to_saw_item",
    "step_to_saw_items",
]

__getattr__, __dir__ = lazy_exports(__name__)
