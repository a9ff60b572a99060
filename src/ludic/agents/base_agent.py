"""The core Agent: an LLM harness of client + context + parser.

The agent owns prompting, memory and parsing; the env never sees raw model text. With a
tokenizer the agent applies the chat template itself and sends token ids (token-in), so
the trace stored in a rollout is exactly what the engine sampled from.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from ludic.context.base import ContextStrategy
from ludic.inference.client import ChatClient
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import SamplingConfig
from ludic.inference.sequence_ids import LastCall, extend_prompt_ids
from ludic.inference.template_ids import chat_template_ids
from ludic.parsers import Parser, ParseResult
from ludic.types import ChatResponse, Info, Message, Obs, validate_messages

INCOMPLETE_REPLY_OBS = (
    "Your reply was cut off at the token limit before it finished. Reply again, more briefly."
)


class Agent:
    """Stateful LLM wrapper: ``reset`` → ``on_env_reset`` → (``act`` → ``on_after_step``)*.

    client: the inference backend. model: the model name sent in requests.
    ctx: memory/prompt strategy. parser: raw text → ParseResult.
    tokenizer: applies the chat template for token-in requests; defaults to ``client.tokenizer``.
    sampling: default sampling for ``act`` (SamplingConfig() if None). A request's
        ``RolloutRequest(inference=...)`` wins over it; see ``ludic.inference.sampling``.
    incomplete_reward: what happens to a reply cut at the token limit (finish_reason "length").
        None (default): it goes to the parser as it is, and on to the env if it parses, so the
        env's and the parser's own rewards score it and the reward scale is the task's. A number:
        such a reply is always a parse failure scored with this reward (the env is not stepped,
        the agent is asked to reply again, more briefly). Either way the step's
        ``info["finish_reason"]`` says "length", so ``drop_incomplete_completions()`` can drop it.
    exact_sequence: build each prompt as the previous prompt + the sampled completion ids + the
        template ids of the new messages (``inference.sequence_ids``), so a multi-turn episode is one
        exact token sequence (``RolloutEngine(one_sequence=True)`` trains it as one). Where the chat
        template or context cannot be extended that way the prompt is re-rendered, the reason is
        in the step info (``sequence_break``) and training falls back to per-step items.
    """

    def __init__(
        self,
        *,
        client: ChatClient,
        model: str,
        ctx: ContextStrategy,
        parser: Parser,
        tokenizer: Any = None,
        sampling: SamplingConfig | None = None,
        incomplete_reward: float | None = None,
        exact_sequence: bool = False,
    ) -> None:
        if not isinstance(ctx, ContextStrategy):
            raise TypeError(f"Agent.ctx must be a ContextStrategy, got {type(ctx).__name__}")
        if not callable(parser):
            raise TypeError(f"Agent.parser must be callable (str -> ParseResult), got {parser!r}")
        if sampling is not None and not isinstance(sampling, SamplingConfig):
            raise TypeError(f"Agent.sampling must be a SamplingConfig, got {type(sampling).__name__}")
        self.client = client
        self.model = model
        self.ctx = ctx
        self.parser = parser
        self.tokenizer = tokenizer if tokenizer is not None else getattr(client, "tokenizer", None)
        if self.tokenizer is not None and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"Agent.tokenizer {type(self.tokenizer).__name__} has no chat_template: set "
                "tokenizer.chat_template (a jinja template) or pass a tokenizer that has one"
            )
        if incomplete_reward is not None and (
            not isinstance(incomplete_reward, (int, float)) or not math.isfinite(incomplete_reward)
        ):
            raise ValueError(
                f"Agent.incomplete_reward must be None (parse cut replies as they are) or a finite number, "
                f"got {incomplete_reward!r}"
            )
        self.sampling = sampling if sampling is not None else SamplingConfig()
        self.incomplete_reward = incomplete_reward
        self.exact_sequence = exact_sequence
        self._last_call: LastCall | None = None
        self.sequence_break: str | None = None

    # --- context hooks -------------------------------------------------------------------
    def reset(self, system_prompt: str | None = None) -> None:
        """Start a new episode (optionally with a new system prompt)."""
        self.ctx.reset(system_prompt)
        self._last_call, self.sequence_break = None, None

    def on_env_reset(self, obs: Obs, info: Info) -> None:
        self.ctx.on_env_reset(obs, info)

    def on_after_step(self, obs: Obs | None, info: Info) -> None:
        self.ctx.on_after_step(obs, info)

    # --- acting --------------------------------------------------------------------------
    async def act(
        self, *, sampling: SamplingConfig | None = None, timeout_s: float | None = None
    ) -> tuple[ParseResult, dict[str, Any]]:
        """One model call on the current context; the reply is recorded and parsed.

        Returns the ParseResult and an info dict with ``raw_text``, ``trace``,
        ``finish_reason``, ``policy_version``, ``sampling_temperature``/``sampling_top_p`` and
        ``chat_response``.
        """
        response, client_info = await self.complete_once(sampling=sampling, timeout_s=timeout_s)
        self.ctx.on_after_act(response)
        return self.parse_reply(response), self.reply_info(response, client_info)

    async def complete_once(
        self, *, sampling: SamplingConfig | None = None, timeout_s: float | None = None
    ) -> tuple[ChatResponse, dict[str, Any]]:
        """Send the context's prompt to the client; does not record the reply."""
        request = self.build_request(self.ctx.on_before_act(), sampling or self.sampling)
        if timeout_s is None:
            response, info = await self.client.complete(request)
        else:
            response, info = await asyncio.wait_for(self.client.complete(request), timeout=timeout_s)
        if self.exact_sequence and request.prompt_token_ids is not None and response.completion_token_ids:
            self._last_call = LastCall(
                request.messages, list(request.prompt_token_ids), list(response.completion_token_ids), response.text
            )
        # the trainer rescales its logits by the same temperature (log-probs of one distribution)
        used = {"sampling_temperature": request.sampling.temperature, "sampling_top_p": request.sampling.top_p}
        return response, {**info, **used}

    def build_request(self, messages: list[Message], sampling: SamplingConfig) -> ChatCompletionRequest:
        """Validate the messages and, with a tokenizer, tokenise them with its chat template
        (with ``tools=`` when the agent has tools)."""
        messages = self.prepare_messages(validate_messages(messages))
        tools = self.tool_schemas()
        prompt_ids = None
        if self.tokenizer is not None and self._last_call is not None:
            prompt_ids, why = extend_prompt_ids(self.tokenizer, self._last_call, messages, tools)
            if prompt_ids is None and self.sequence_break is None:
                self.sequence_break = why
        if self.tokenizer is not None and prompt_ids is None:
            prompt_ids = chat_template_ids(self.tokenizer, messages, tools=tools)
        return ChatCompletionRequest(
            model=self.model, messages=messages, sampling=sampling, prompt_token_ids=prompt_ids, tools=tools
        )

    def prepare_messages(self, messages: list[Message]) -> list[Message]:
        """Hook: the messages actually sent (e.g. with tool instructions); the history is unchanged."""
        return messages

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """Hook: JSON-schema tool descriptions passed as ``tools=`` (None: no tools)."""
        return None

    def parse_reply(self, response: ChatResponse) -> ParseResult:
        """Parse the reply; a reply cut at the token limit fails only when ``incomplete_reward`` is set."""
        if response.finish_reason == "length" and self.incomplete_reward is not None:
            return ParseResult(action=None, reward=self.incomplete_reward, obs=INCOMPLETE_REPLY_OBS)
        result = self.parser(response.text)
        if not isinstance(result, ParseResult):
            raise TypeError(f"parser {self.parser!r} returned {type(result).__name__}, not ParseResult")
        return result

    def reply_info(self, response: ChatResponse, client_info: dict[str, Any]) -> dict[str, Any]:
        version = response.policy_version
        if version is None:
            version = client_info.get("policy_version")
        return {
            "raw_text": response.text,
            "trace": response.to_trace(),
            "finish_reason": response.finish_reason,
            "policy_version": version,
            "sampling_temperature": client_info.get("sampling_temperature"),
            "sampling_top_p": client_info.get("sampling_top_p"),
            "chat_response": response,
            **({"sequence_break": self.sequence_break} if self.exact_sequence else {}),
        }
