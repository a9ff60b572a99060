"""Interaction protocols: the explicit agent-environment loop, outside both."""

from ludic.interaction.base import InteractionProtocol
from ludic.interaction.multi_agent import MultiAgentProtocol
from ludic.interaction.openai_program import OpenAIProgramProtocol, ProgramTask
from ludic.interaction.single_agent import SingleAgentProtocol, SingleAgentSyncProtocol
from ludic.interaction.trace_collector import TraceCollector

__all__ = [
    "InteractionProtocol",
    "MultiAgentProtocol",
    "OpenAIProgramProtocol",
    "ProgramTask",
    "SingleAgentProtocol",
    "SingleAgentSyncProtocol",
    "TraceCollector",
]
