"""ReAct (Yao et al., 2022, arXiv:2210.03629): interleave reasoning, tool calls and observations.

Here that is a ToolAgent that may loop up to ``max_react_steps`` tool-call replies per
``act``; if its last allowed reply still calls a tool, it is told the budget is spent
and asked once more for a final answer, which is what the parser sees.
"""

from __future__ import annotations

from typing import Any

from ludic.agents.tool_agent import ToolAgent
from ludic.inference.sampling import SamplingConfig
from ludic.types import ChatResponse

REACT_GUIDE = (
    "Work step by step: think, call a tool when you need information, read its result, "
    "and repeat. When you know the answer, reply with the answer and no tool call."
)
FINAL_ANSWER_PROMPT = "You have used all {n} tool steps. Give your final answer now, without tool calls."


class ReActAgent(ToolAgent):
    """Tool loop of at most ``max_react_steps`` tool-call replies, then a forced final answer."""

    def __init__(self, *, max_react_steps: int = 5, **tool_agent_kwargs: Any) -> None:
        if not isinstance(max_react_steps, int) or max_react_steps < 1:
            raise ValueError(f"max_react_steps must be an int >= 1, got {max_react_steps!r}")
        super().__init__(max_tool_rounds=max_react_steps, **tool_agent_kwargs)
        self.max_react_steps = max_react_steps

    def tool_instructions(self) -> str:
        return f"{REACT_GUIDE}\n{super().tool_instructions()}"

    async def on_tool_budget_exhausted(
        self, *, sampling: SamplingConfig | None, timeout_s: float | None
    ) -> tuple[ChatResponse, dict[str, Any]]:
        self.ctx.append_message(
            {"role": "user", "content": FINAL_ANSWER_PROMPT.format(n=self.max_react_steps)}
        )
        response, client_info = await self.complete_once(sampling=sampling, timeout_s=timeout_s)
        self.ctx.on_after_act(response)
        return response, client_info
