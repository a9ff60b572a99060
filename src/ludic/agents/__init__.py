"""Agents: LLM harnesses (client + context + parser), optionally with tools."""

from ludic.agents.base_agent import Agent

__all__ = ["Agent"]
