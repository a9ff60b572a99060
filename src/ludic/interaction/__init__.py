"""Interaction protocols: the explicit agent-environment loop, outside both."""

from ludic.interaction.base import InteractionProtocol
from ludic.interaction.single_agent import SingleAgentProtocol, SingleAgentSyncProtocol

__all__ = ["InteractionProtocol", "SingleAgentProtocol", "SingleAgentSyncProtocol"]
