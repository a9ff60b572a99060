"""One request's row in a decoding run, and what the run returns for it (``_generation``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ludic.inference.sampling import SamplingConfig


@dataclass
class RowRequest:
    prompt_ids: list[int]
    sampling: SamplingConfig
    cancelled: bool = False  # set by the caller's task when it gives up; the row is dropped
    generated: list[int] = field(default_factory=list)  # completion so far (earlier weights): read as prompt
    origin: RowRequest | None = None  # the request this continues (its ``cancelled`` counts here too)

    def is_cancelled(self) -> bool:
        return self.cancelled or (self.origin is not None and self.origin.is_cancelled())

    def continued(self, generated: list[int]) -> RowRequest:
        """This row after ``generated`` tokens, to decode on from a fresh prefill of prompt + them."""
        left = self.sampling.max_tokens - len(generated)
        return RowRequest(self.prompt_ids, replace(self.sampling, max_tokens=left), generated=list(generated), origin=self)


@dataclass
class RowResult:
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    stop_text_end: int | None = None  # where a stop string starts in the decoded text
