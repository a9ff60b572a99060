"""The explicit agent-environment loop lives here, outside both."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ludic.envs.env import LudicEnv
from ludic.inference.sampling import InferenceSpec
from ludic.types import Rollout


class InteractionProtocol(ABC):
    """Runs one episode and returns one Rollout per managed agent (``meta["agent_id"]``)."""

    @abstractmethod
    async def run(
        self,
        *,
        env: LudicEnv,
        max_steps: int,
        env_seed: int | None = None,
        sampling_seed: int | None = None,
        inference: InferenceSpec | None = None,
        timeout_s: float | None = None,
    ) -> list[Rollout]: ...
