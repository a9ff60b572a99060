"""From requests to SAW batches: the rollout engine, request strategies, batch sources, micro-batching."""

from ludic.training.batching.jsonl import (
    iter_jsonl,
    rollout_from_dict,
    rollout_to_dict,
    saw_item_from_dict,
    saw_item_to_dict,
)
from ludic.training.batching.micro_batching import collate_saw_items, split_items_by_token_budget
from ludic.training.batching.offline_batch_source import OfflineBatchSource
from ludic.training.batching.pipeline_actor import ActorStats, run_pipeline_actor
from ludic.training.batching.pipeline_batch_source import PipelineBatchSource
from ludic.training.batching.pipeline_codec import BadEntry, decode_entry, encode_item
from ludic.training.batching.pipeline_stream import PipelineStream
from ludic.training.batching.pipeline_version import PipelineVersionPublisher
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
from ludic.training.batching.sft_items import end_of_turn_id, sft_item, sft_items

__all__ = [
    "ActorStats",
    "BadEntry",
    "Curriculum",
    "DatasetRequests",
    "EpisodeFailuresError",
    "GRPORequestStrategy",
    "IdentityRequestStrategy",
    "OfflineBatchSource",
    "PipelineBatchSource",
    "PipelineStream",
    "PipelineVersionPublisher",
    "RequestStrategy",
    "RolloutBatchSource",
    "RolloutEngine",
    "collate_saw_items",
    "decode_entry",
    "derive_seed",
    "encode_item",
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
    "run_pipeline_actor",
    "saw_item_from_dict",
    "saw_item_to_dict",
    "sft_item",
    "sft_items",
    "split_items_by_token_budget",
    "step_to_saw_item",
    "step_to_saw_items",
]
