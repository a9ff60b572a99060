"""Agents: LLM harnesses (client + context + parser), optionally with tools."""

from ludic.agents.base_agent import Agent
from ludic.agents.react_agent import ReActAgent
from ludic.agents.tool_agent import ToolAgent
from ludic.agents.tools import Tool

__all__ = ["Agent", "ReActAgent", "Tool", "ToolAgent"]
