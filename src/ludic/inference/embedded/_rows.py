"""One request's row in a decoding run, and what the run returns for it (``_generation``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ludic.inference.sampling import SamplingConfig

TokenSink = Callable[[int, int], None]
"""``sink(position in the completion, token id)``, called on the decoding thread as each token is sampled
(a position seen before means the row was decoded again from there: a failed batch rerun row by row)."""


@dataclass
class RowRequest:
    prompt_ids: list[int]
    sampling: SamplingConfig
    cancelled: bool = False  # set by the caller's task when it gives up; the row is dropped
    generated: list[int] = field(default_factory=list)  # completion so far (earlier weights): read as prompt
    origin: RowRequest | None = None  # the request this continues (its ``cancelled`` counts here too)
    on_token: TokenSink | None = None  # streaming: told each token as it is sampled

    def emit(self, position: int, token: int) -> None:
        """Tell the sink; a sink that raises is dropped (streaming is never worth failing the batch)."""
        if self.on_token is not None:
            try:
                self.on_token(position, token)
            except Exception:
                self.on_token = None

    def is_cancelled(self) -> bool:
        return self.cancelled or (self.origin is not None and self.origin.is_cancelled())

    def continued(self, generated: list[int]) -> RowRequest:
        """This row after ``generated`` tokens, to decode on from a fresh prefill of prompt + them."""
        left = self.sampling.max_tokens - len(generated)
        return RowRequest(self.prompt_ids, replace(self.sampling, max_tokens=left), generated=list(generated),
                          origin=self, on_token=self.on_token)  # fmt: skip


@dataclass
class RowResult:
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_text_end: int | None = None  # where a stop string starts in the decoded text


def emit_step(rows: list[RowRequest], alive: list[int], tokens: list[int], position: int) -> None:
    """Tell each live row's sink its token of this decoding step."""
    for i, token in zip(alive, tokens, strict=True):
        rows[i].emit(position, token)
