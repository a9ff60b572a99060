"""Pipeline RL end to end: actors push SAW items to a Redis stream, the trainer's batch source pops
them; the codec, the stream, policy versions, the private Redis server."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.training.pipeline.actor import ActorStats, run_pipeline_actor
    from ludic.training.pipeline.batch_source import PipelineBatchSource
    from ludic.training.pipeline.codec import BadEntry, decode_entry, encode_item
    from ludic.training.pipeline.stream import PipelineStream
    from ludic.training.pipeline.version import PipelineVersionPublisher

__all__ = [
    "ActorStats",
    "BadEntry",
    "PipelineBatchSource",
    "PipelineStream",
    "PipelineVersionPublisher",
    "decode_entry",
    "encode_item",
    "run_pipeline_actor",
]

__getattr__, __dir__ = lazy_exports(__name__)
