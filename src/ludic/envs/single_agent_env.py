"""Gym-like convenience base for single-agent tasks."""

from __future__ import annotations

from abc import abstractmethod

from ludic.envs.env import LudicEnv
from ludic.types import Info, Obs, StepOutcome

SINGLE_AGENT_ID = "agent_0"


class SingleAgentEnv(LudicEnv[str, str, str]):
    """Implement ``env_reset``/``env_step``/``env_current_obs``; the multi-agent API is derived."""

    agent_id: str = SINGLE_AGENT_ID

    @property
    def agent_ids(self) -> list[str]:
        return [self.agent_id]

    @property
    def active_agents(self) -> list[str]:
        return [self.agent_id]

    @abstractmethod
    def env_reset(self, *, seed: int | None = None) -> tuple[Obs, Info]: ...

    @abstractmethod
    def env_step(self, action: str) -> StepOutcome: ...

    @abstractmethod
    def env_current_obs(self) -> Obs: ...

    def reset(self, seed: int | None = None) -> dict[str, tuple[Obs, Info]]:
        return {self.agent_id: self.env_reset(seed=seed)}

    async def env_astep(self, action: str) -> StepOutcome:
        """Async step; defaults to ``env_step``. Override for steps that wait (see ``LudicEnv.astep``)."""
        return self.env_step(action)

    def step(self, actions: dict[str, str]) -> dict[str, StepOutcome]:
        return {self.agent_id: self.env_step(self._only_action(actions))}

    async def astep(self, actions: dict[str, str]) -> dict[str, StepOutcome]:
        return {self.agent_id: await self.env_astep(self._only_action(actions))}

    def _only_action(self, actions: dict[str, str]) -> str:
        if set(actions) != {self.agent_id}:
            raise KeyError(
                f"{type(self).__name__} expects exactly one action for {self.agent_id!r}, "
                f"got actions for {sorted(actions)}"
            )
        return actions[self.agent_id]
