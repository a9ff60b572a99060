"""The user's own agent: plain OpenAI-SDK code with one tool (a calculator). Not Ludic code: what a user brings.

``[protocol] name = "openai_program"`` with ``program = "calculator_agent:solve"`` plays it as Ludic episodes:
the client it gets points at the run's server, and every call it makes (prompt ids, reply ids, log-probs) is
recorded and trained as one exact sequence. The tool is described in the system prompt as well as in
``tools=[...]``, because SmolLM2's chat template renders no tools; the server reads the ``<tool_call>`` block
(``--tool-parser hermes``) and answers with OpenAI ``tool_calls``.
"""

import json
import re

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
SYSTEM = (
    "You can use a calculator. To multiply, reply with exactly "
    '<tool_call>{"name": "calculator", "arguments": {"a": A, "b": B}}</tool_call> '
    "and wait for the result. Then give the final answer as a number."
)


def calculator(arguments: str) -> str:
    """The tool: the product of ``a`` and ``b``, or an error message the model sees."""
    try:
        args = json.loads(arguments)
        return str(int(args["a"]) * int(args["b"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"


async def solve(client, task) -> str:
    """Ask; run the calculator for each call the reply makes; ask again with the results. The answer returned is
    the last number of the final reply (the data set's answers are numbers)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task.prompt}]
    reply = await client.chat.completions.create(model=task.model, messages=messages, tools=[CALCULATOR],
                                                 max_tokens=48)
    message = reply.choices[0].message
    if message.tool_calls:
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculator(call.function.arguments)})
        reply = await client.chat.completions.create(model=task.model, messages=messages, tools=[CALCULATOR],
                                                     max_tokens=16)
        message = reply.choices[0].message
    numbers = re.findall(r"-?\d+", message.content or "")
    return numbers[-1] if numbers else (message.content or "")
