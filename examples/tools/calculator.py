"""The task, the tool and the two agents of ``train_tools.py``: sums a tiny model cannot do in its head.

``SumEnv`` asks "What is 417 + 286?" and scores the answer by exact match. ``with_calculator`` is an
OpenAI-SDK program that makes the model call ``add`` (``tool_choice`` names it: Ludic's server prefills
the call's opening, the model writes the arguments), runs the tool and asks again with the result;
``without_tool`` asks once. ``demonstrations`` writes what each agent should say, for the SFT warm start.
"""

from __future__ import annotations

import json
import random
from typing import Any

from ludic.envs import SingleAgentEnv
from ludic.inference.sequence_ids import LastCall, extend_prompt_ids
from ludic.inference.template_ids import chat_template_ids
from ludic.inference.tool_parsers import HermesToolParser
from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.batching.sft_data import end_of_turn_id, sft_item
from ludic.training.types import SAWItem
from ludic.types import StepOutcome

ADD = {"type": "function", "function": {"name": "add", "description": "a + b"}}
"""The tool's schema (short on purpose: the tiny model reads every byte of the tools block in its prompt)."""
FORCE_ADD = {"type": "function", "function": {"name": "add"}}


def add(a: int, b: int) -> int:
    """The tool: what the model cannot do in its head."""
    return a + b


class SumEnv(SingleAgentEnv):
    """One question, ``digits``-digit operands; reward 1 for the exact sum, else 0."""

    def __init__(self, digits: int = 3) -> None:
        super().__init__()
        self.digits = digits

    def env_reset(self, *, seed: int | None = None):
        self.a, self.b = operands(seed, self.digits)
        return self.env_current_obs(), {}

    def env_step(self, action: str) -> StepOutcome:
        correct = action.strip() == str(self.a + self.b)
        return StepOutcome(None, float(correct), False, True, {"correct": correct})

    def env_current_obs(self) -> str:
        return question(self.a, self.b)


def operands(seed: int | None, digits: int) -> tuple[int, int]:
    rng = random.Random(seed)
    low, high = 10 ** (digits - 1), 10**digits - 1
    return rng.randint(low, high), rng.randint(low, high)


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def call_text(a: int, b: int) -> str:
    """The call as the model writes it (Hermes, as the tiny model's chat template teaches)."""
    return '<tool_call>{"name": "add", "arguments": ' + json.dumps({"a": a, "b": b}) + "}</tool_call>"


async def with_calculator(client: Any, task: Any) -> str:
    """Call ``add`` (forced), run it, answer with its result in view."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    first = await client.chat.completions.create(model=task.model, messages=messages, tools=[ADD],
                                                 tool_choice=FORCE_ADD, max_tokens=32)  # fmt: skip
    message = first.choices[0].message
    if not message.tool_calls:  # the model's arguments did not parse (tool_choice_unmet): no answer
        return ""
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls:
        try:
            result = str(add(**json.loads(call.function.arguments)))
        except (TypeError, ValueError) as exc:  # wrong or missing arguments: the model sees the error
            result = f"error: {exc}"
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    final = await client.chat.completions.create(model=task.model, messages=messages, tools=[ADD], max_tokens=8)
    return final.choices[0].message.content or ""


async def without_tool(client: Any, task: Any) -> str:
    """The baseline: the model answers from the question alone."""
    messages = [{"role": "user", "content": task.prompt}]
    reply = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=8)
    return reply.choices[0].message.content or ""


def demonstrations(tokenizer: Any, seeds: range, *, digits: int, tool: bool) -> list[SAWItem]:
    """What each agent should say on the training seeds: SFT items whose ids are the ones its calls send.

    With the tool, two items a question, built as Ludic's server builds them: the call, whose forced opening
    is prompt (the server prefills it, tokenised on its own; RL never trains it either) and whose arguments are
    trained; and the answer, whose prompt is the call's ids verbatim followed by the tool's result (the splice
    the server makes when the agent sends the call back with its ids)."""
    items = []
    opening = HermesToolParser().forced_prefix(FORCE_ADD["function"]["name"], tokenizer.chat_template)
    opening_ids = tokenizer.encode(opening, add_special_tokens=False)
    eot = end_of_turn_id(tokenizer)
    for seed in seeds:
        a, b = operands(seed, digits)
        ask = [{"role": "user", "content": question(a, b)}]
        if not tool:
            items.append(sft_item(tokenizer, ask, str(a + b)))
            continue
        call = call_text(a, b)
        asked = chat_template_ids(tokenizer, ask, tools=[ADD])
        reply = [*opening_ids, *tokenizer.encode(call[len(opening) :], add_special_tokens=False), eot]
        items.append(prompt_completion_item([*asked, *opening_ids], reply[len(opening_ids) :], weight=1.0,
                                            meta={"prompt_length": len(asked) + len(opening_ids),
                                                  "completion_length": len(reply) - len(opening_ids)}))  # fmt: skip
        called = [*ask, {"role": "assistant", "content": call},
                  {"role": "tool", "tool_call_id": "call_0", "content": str(add(a, b))}]  # fmt: skip
        then, why = extend_prompt_ids(tokenizer, LastCall(ask, asked, reply, call), called, [ADD])
        if then is None:
            raise ValueError(f"the chat template does not extend the call's ids with the tool's result: {why}")
        answer = [*tokenizer.encode(str(a + b), add_special_tokens=False), eot]
        items.append(prompt_completion_item(then, answer, weight=1.0,
                                            meta={"prompt_length": len(then), "completion_length": len(answer)}))  # fmt: skip
    return items
