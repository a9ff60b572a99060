"""A table of sampled completions (prompt, reply, reward) every N steps, like TRL's ``log_completions``.

The Trainer stays algorithm-blind: :class:`BatchTap` wraps the run's batch source and keeps the items of
the batch it handed out last; :class:`CompletionsLogger`, one sink of the run's ``TeeLogger``, reads them
every ``every`` steps, decodes a few (one per prompt first, so a table shows different tasks), appends them
to ``completions.jsonl`` and hands them to every sink with a ``log_completions(step, samples)`` method (the
plain log, the dashboard, W&B as a table, TensorBoard as text) through ``TeeLogger.log_completions``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ludic.training.types import SAWBatch, SAWItem

COMPLETIONS_FILE = "completions.jsonl"
"""The samples go to ``<logging.output_dir>/completions.jsonl``, one JSON object per sample."""


@dataclass(frozen=True)
class CompletionSample:
    """One sampled completion of a training batch: the prompt and the reply as text, and the episode's reward."""

    step: int
    prompt: str
    reply: str
    reward: float | None


class BatchTap:
    """A batch source that is ``inner``, keeping ``latest``: the items of the batch it handed out last."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.latest: list[SAWItem] = []

    async def next_batch(self) -> SAWBatch:
        batch = await self.inner.next_batch()
        self.latest = list(batch.items)
        return batch

    def __getattr__(self, name: str) -> Any:  # state_dict, close, ...: the inner source's own
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def sample_items(items: Sequence[SAWItem], count: int) -> list[SAWItem]:
    """Up to ``count`` items, one per distinct prompt first (a GRPO group's replies share one), in batch order."""
    seen: set[tuple[int, ...]] = set()
    first, rest = [], []
    for item in items:
        prompt = tuple(prompt_ids(item))
        (rest if prompt in seen else first).append(item)
        seen.add(prompt)
    return (first + rest)[:count]


def prompt_ids(item: SAWItem) -> list[int]:
    """The tokens before the first action token (the whole state for a one-call item)."""
    start = item.action_mask.index(1) if 1 in item.action_mask else len(item.input_ids)
    return item.input_ids[:start]


def reply_ids(item: SAWItem) -> list[int]:
    """Every action token (a multi-turn sequence: every reply of the episode, in order)."""
    return [t for t, a in zip(item.input_ids, item.action_mask, strict=True) if a]


def to_sample(step: int, item: SAWItem, decode: Callable[[list[int]], str]) -> CompletionSample:
    reward = item.meta.get("total_reward", item.meta.get("reward"))
    reward = float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None
    return CompletionSample(step, decode(prompt_ids(item)), decode(reply_ids(item)), reward)


class CompletionsLogger:
    """Every ``every`` steps: ``count`` samples of the latest batch to ``path`` (JSON lines) and to ``sinks``
    (anything with ``log_completions``, usually the run's ``TeeLogger``). ``decode``: token ids -> text."""

    def __init__(self, tap: BatchTap, decode: Callable[[list[int]], str], *, every: int, count: int = 4,
                 path: str | Path, sinks: Any = None) -> None:  # fmt: skip
        if every < 1 or count < 1:
            raise ValueError(f"CompletionsLogger needs every >= 1 and count >= 1, got {every} and {count}")
        self.tap, self.decode, self.every, self.count = tap, decode, every, count
        self.path = Path(path)
        self.sinks = sinks

    def log(self, step: int, stats: Mapping[str, Any]) -> None:
        if step % self.every or not self.tap.latest:
            return
        samples = [to_sample(step, item, self.decode) for item in sample_items(self.tap.latest, self.count)]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(asdict(s)) + "\n" for s in samples)
        if self.sinks is not None:
            self.sinks.log_completions(step, samples)


def short(text: str, limit: int) -> str:
    """``text`` on one line, its end kept when too long (a prompt's question is at its end)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else "..." + flat[-(limit - 3) :]


def plain_table(step: int, samples: Sequence[CompletionSample], *, prefix: str = "[ludic]", width: int = 70) -> str:
    """The plain log's table: a header line, then ``reward | prompt (its end) | reply`` per sample."""
    lines = [f"{prefix} completions at step {step} (reward | prompt | reply):".strip()]
    for s in samples:
        reward = "-" if s.reward is None else f"{s.reward:.3f}"
        lines.append(f"  {reward} | {short(s.prompt, width)} | {short(s.reply, width)}")
    return "\n".join(lines)


def markdown_table(samples: Sequence[CompletionSample]) -> str:
    """TensorBoard's text: a markdown table (``|`` escaped, newlines as ``<br>``)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", "<br>")

    rows = ["| reward | prompt | reply |", "| --- | --- | --- |"]
    for s in samples:
        rows.append(f"| {'-' if s.reward is None else f'{s.reward:.4f}'} | {cell(s.prompt)} | {cell(s.reply)} |")
    return "\n".join(rows)
