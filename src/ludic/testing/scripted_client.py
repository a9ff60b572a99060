"""A ChatClient test double that replies with canned texts.

For protocol and agent unit tests only: it stands in for an inference backend when the
test is about the loop around it. Token ids are fake but deterministic (one id per UTF-8
byte of the text), so tests can check that traces flow through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ludic.inference.request import ChatCompletionRequest
from ludic.types import ChatResponse

Reply = str | tuple[str, str]  # text, or (text, finish_reason)
ReplyFn = Callable[[ChatCompletionRequest], Reply]

FAKE_LOGPROB = -0.5


def fake_token_ids(text: str) -> list[int]:
    """One id per UTF-8 byte: deterministic and easy to check by hand."""
    return list(text.encode("utf-8"))


class ScriptedChatClient:
    """Replies from a script: a list of replies (in order) or a function of the request.

    A reply is a text (finish_reason "stop") or ``(text, finish_reason)``. Every request
    is kept in ``requests``. Prompt ids are the request's ``prompt_token_ids`` when the
    agent sent them (token-in), else the fake ids of the joined message contents.
    """

    def __init__(
        self,
        replies: Sequence[Reply] | ReplyFn,
        *,
        tokenizer: Any = None,
        model_name: str = "scripted",
        policy_version: int = 0,
    ) -> None:
        self._script: list[Reply] | None = None if callable(replies) else list(replies)
        self._fn: ReplyFn | None = replies if callable(replies) else None
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.policy_version = policy_version
        self.requests: list[ChatCompletionRequest] = []

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        self.requests.append(request)
        reply = self._next_reply(request)
        text, finish_reason = (reply, "stop") if isinstance(reply, str) else reply
        if request.prompt_token_ids is not None:
            prompt_ids = list(request.prompt_token_ids)
        else:
            prompt_ids = fake_token_ids("".join(m.get("content") or "" for m in request.messages))
        completion_ids = fake_token_ids(text)
        response = ChatResponse(
            text=text,
            finish_reason=finish_reason,
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids,
            completion_logprobs=[FAKE_LOGPROB] * len(completion_ids),
            policy_version=self.policy_version,
        )
        return response, {"policy_version": self.policy_version, "backend": "scripted"}

    def _next_reply(self, request: ChatCompletionRequest) -> Reply:
        if self._fn is not None:
            return self._fn(request)
        assert self._script is not None
        if len(self.requests) > len(self._script):
            raise IndexError(
                f"ScriptedChatClient ran out of replies: request {len(self.requests)} "
                f"but only {len(self._script)} scripted"
            )
        return self._script[len(self.requests) - 1]

    def sync_weights(
        self, params: Mapping[str, torch.Tensor], *, timeout_s: float = 600.0, version: int | None = None
    ) -> str:
        self.policy_version = self.policy_version + 1 if version is None else version
        return f"scripted: {len(params)} tensors, version {self.policy_version}"

    async def get_policy_version(self) -> int:
        return self.policy_version

    def close(self) -> None:
        """Nothing to release."""


__all__ = ["FAKE_LOGPROB", "ScriptedChatClient", "fake_token_ids"]
