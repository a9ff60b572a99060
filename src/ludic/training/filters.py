"""Sample filters: ``Callable[[SAWItem], bool]`` returning True to KEEP the sample."""

from __future__ import annotations

from ludic.training.types import SampleFilter, SAWItem


def drop_truncated() -> SampleFilter:
    """Drop samples from episodes cut short (max_steps or env truncation)."""

    def keep(item: SAWItem) -> bool:
        return not (item.meta.get("truncated") or item.meta.get("episode_truncated"))

    return keep


def drop_incomplete_completions() -> SampleFilter:
    """Drop completions the engine cut at the token limit (``finish_reason == "length"``)."""

    def keep(item: SAWItem) -> bool:
        return item.meta.get("finish_reason") != "length"

    return keep


def drop_parse_errors() -> SampleFilter:
    """Drop steps whose action failed to parse."""

    def keep(item: SAWItem) -> bool:
        return not item.meta.get("parse_error", False)

    return keep


def combine(*filters: SampleFilter) -> SampleFilter:
    """Keep a sample only if every filter keeps it."""

    def keep(item: SAWItem) -> bool:
        return all(f(item) for f in filters)

    return keep
