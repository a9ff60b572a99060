"""How stale a batch was: its items counted by how many policy versions behind the trainer they were sampled.

An item's staleness is the trainer's version when the batch source began the batch (what
``PipelineVersionPublisher`` last announced: the number of weight publishes so far) minus the item's
``policy_version`` (the version the actor's client reported when it began sampling the item's episode).
Items more than ``max_staleness`` behind are dropped before they get here (``pipeline/dropped_stale``);
docs/pipeline_rl.md, "Staleness contract".
"""

from __future__ import annotations


def staleness_histogram(staleness: list[int], max_staleness: int) -> dict[str, float]:
    """``pipeline/staleness/<k>``: how many of a batch's items were sampled ``k`` policy versions behind the
    trainer, for k = 0 .. ``max_staleness`` (every key present, zeros too, so each is a continuous series).
    An item sampled under weights published after the batch read the trainer's version counts as 0."""
    counts = [0] * (max_staleness + 1)
    for behind in staleness:
        counts[min(max(behind, 0), max_staleness)] += 1
    return {f"pipeline/staleness/{k}": float(n) for k, n in enumerate(counts)}
