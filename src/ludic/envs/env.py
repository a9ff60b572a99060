"""The multi-agent environment kernel.

Environments are pure state machines with optional rewards and prompts; prompting,
parsing and memory belong to agents.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from ludic.types import Info, StepOutcome

AgentT = TypeVar("AgentT")
ObsT = TypeVar("ObsT")
ActionT = TypeVar("ActionT")


class LudicEnv(ABC, Generic[AgentT, ObsT, ActionT]):
    """Multi-agent aware environment.

    ``reset`` returns each agent's first observation; ``step`` takes the actions of the
    agents in ``active_agents`` and returns an outcome per agent.
    """

    @property
    @abstractmethod
    def agent_ids(self) -> list[AgentT]:
        """All agent roles in this environment."""

    @property
    @abstractmethod
    def active_agents(self) -> list[AgentT]:
        """The agents expected to act on the next step."""

    @abstractmethod
    def reset(self, seed: int | None = None) -> dict[AgentT, tuple[ObsT, Info]]:
        """Start an episode."""

    @abstractmethod
    def step(self, actions: dict[AgentT, ActionT]) -> dict[AgentT, StepOutcome]:
        """Apply the actions of the active agents."""

    async def astep(self, actions: dict[AgentT, ActionT]) -> dict[AgentT, StepOutcome]:
        """What the protocols call. Defaults to ``step``; an env whose step waits on I/O or heavy CPU
        work (running code, a verifier) overrides it so other episodes run meanwhile."""
        return self.step(actions)

    @property
    def suggested_sysprompt(self) -> str | None:
        """A system prompt the env recommends to agents (optional)."""
        return None
