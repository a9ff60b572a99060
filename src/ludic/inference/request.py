"""The request a ChatClient serves."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ludic.inference.sampling import SamplingConfig
from ludic.types import Message, validate_messages


@dataclass(frozen=True)
class ChatCompletionRequest:
    """One chat completion.

    Token-in: when ``prompt_token_ids`` is set the client samples from exactly those ids
    (the agent applied the chat template itself) and ``messages`` is only for logging.
    Without it, the client applies its tokenizer's chat template to ``messages``.
    """

    model: str
    messages: list[Message]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    prompt_token_ids: list[int] | None = None
    return_logprobs: bool = True
    extras: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None
    """JSON-schema tool descriptions (OpenAI ``tools``); rendered by the chat template when the
    client templates ``messages`` itself, and sent to servers as ``"tools"``."""

    def __post_init__(self) -> None:
        validate_messages(self.messages)
        if not isinstance(self.sampling, SamplingConfig):
            raise TypeError(f"sampling must be a SamplingConfig, got {type(self.sampling).__name__}")
        if self.prompt_token_ids is not None:
            ids = self.prompt_token_ids
            if not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
                raise ValueError("prompt_token_ids must be a non-empty list of non-negative ints")
