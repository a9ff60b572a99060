"""The explicit agent-environment loop lives here, outside both."""

from __future__ import annotations

import asyncio

from ludic.envs.env import LudicEnv
from ludic.inference.sampling import InferenceSpec
from ludic.types import Rollout


class InteractionProtocol:
    """Runs one episode and returns one Rollout per managed agent (``meta["agent_id"]``).

    A protocol writes ``_episode``; ``run`` checks ``max_steps`` and bounds the episode by ``timeout_s``
    for it. A protocol with its own budget and deadline (``OpenAIProgramProtocol``) overrides ``run``.
    """

    async def run(
        self,
        *,
        env: LudicEnv,
        max_steps: int,
        env_seed: int | None = None,
        sampling_seed: int | None = None,
        inference: InferenceSpec | None = None,
        timeout_s: float | None = None,
    ) -> list[Rollout]:
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
        try:
            async with asyncio.timeout(timeout_s):
                return await self._episode(env, max_steps, env_seed, sampling_seed, inference)
        except TimeoutError as exc:
            raise TimeoutError(f"episode exceeded timeout_s={timeout_s}") from exc

    async def _episode(
        self, env: LudicEnv, max_steps: int, env_seed: int | None, sampling_seed: int | None,
        inference: InferenceSpec | None,
    ) -> list[Rollout]:  # fmt: skip
        """One episode of at most ``max_steps`` steps (turns): one Rollout per managed agent."""
        raise NotImplementedError(f"{type(self).__name__} must implement _episode (or override run)")
