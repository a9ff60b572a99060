"""Core trajectory types shared by every layer of Ludic.

An *episode* is one run of an environment; a *rollout* is one agent's view of it.
A rollout is a list of :class:`Step` records, each holding what the agent saw, what it
said (the raw model text) and the exact tokens that were sampled (:class:`TokenTrace`),
so training never re-tokenises generated text.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

AgentID = str
Obs = str
Action = str
Info = dict[str, Any]

Role = Literal["system", "user", "assistant", "tool"]
_ROLES = ("system", "user", "assistant", "tool")


class Message(TypedDict, total=False):
    """A chat message: ``{"role": "...", "content": "..."}`` (tool messages may add keys)."""

    role: str
    content: str
    name: str
    tool_call_id: str
    tool_calls: list[dict[str, Any]]


def validate_messages(messages: Any) -> list[Message]:
    """Check that ``messages`` is a list of ``{"role", "content"}`` dicts; raise naming the culprit."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"messages must be a non-empty list of dicts, got {messages!r}")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be a dict, got {type(msg).__name__}: {msg!r}")
        role = msg.get("role")
        if role not in _ROLES:
            raise ValueError(f"messages[{i}]['role'] must be one of {_ROLES}, got {role!r}")
        content = msg.get("content")
        if not isinstance(content, str) and not (content is None and msg.get("tool_calls")):
            raise ValueError(
                f"messages[{i}]['content'] must be a str, got {type(content).__name__}: {content!r}"
            )
    return messages


@dataclass
class TokenTrace:
    """The canonical token-level record of one model call: exactly what was sampled."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float] | None = None
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if self.completion_logprobs is not None and len(self.completion_logprobs) != len(
            self.completion_token_ids
        ):
            raise ValueError(
                f"completion_logprobs has {len(self.completion_logprobs)} entries, "
                f"completion_token_ids {len(self.completion_token_ids)}"
            )


@dataclass
class ChatResponse:
    """Normalised LLM output: text plus the token ids and sampling logprobs behind it."""

    text: str
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    policy_version: int | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """Structured tool calls when the server parsed them (OpenAI shape), else None."""

    def to_trace(self) -> TokenTrace | None:
        """The token trace of this response, or ``None`` if the backend returned no token ids."""
        if self.prompt_token_ids is None or self.completion_token_ids is None:
            return None
        return TokenTrace(
            prompt_token_ids=list(self.prompt_token_ids),
            completion_token_ids=list(self.completion_token_ids),
            completion_logprobs=(
                list(self.completion_logprobs) if self.completion_logprobs is not None else None
            ),
            finish_reason=self.finish_reason,
        )


@dataclass
class StepOutcome:
    """What an environment returns for one agent after a step."""

    obs: Obs | None
    reward: float
    truncated: bool
    terminated: bool
    info: Info = field(default_factory=dict)


@dataclass
class Step:
    """One agent-environment interaction step.

    ``action`` is the raw model text; the parsed action is ``info["parsed_action"]``.
    ``reward`` is the env reward plus the parser's format reward. Terminal and truncated
    last steps have ``next_obs=None``. ``tool_traces`` are the token traces of the model
    calls of this turn that came before the final reply (tool-call replies, in order); they
    are trained with the turn's credit like ``trace``.
    """

    index: int
    prev_obs: Obs | None
    action: str
    next_obs: Obs | None
    reward: float
    truncated: bool
    terminated: bool
    info: Info = field(default_factory=dict)
    trace: TokenTrace | None = None
    tool_traces: list[TokenTrace | None] = field(default_factory=list)


def _new_rollout_id() -> str:
    return uuid.uuid4().hex


@dataclass
class Rollout:
    """One agent's perspective on an episode."""

    id: str = field(default_factory=_new_rollout_id)
    steps: list[Step] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def total_reward(self) -> float:
        return float(sum(step.reward for step in self.steps))

    @property
    def length(self) -> int:
        return len(self.steps)
