"""Per-agent trajectory collection for multi-agent episodes.

An episode is one run of the env; each managed agent gets its own clean rollout holding
only its own steps. Rewards and endings that reach an agent while it is not acting (the
opponent's winning move makes it lose) are credited to that agent's latest step.
"""

from __future__ import annotations

from typing import Any

from ludic.types import Info, Obs, Rollout, Step


class TraceCollector:
    """Collects Steps per agent id and builds one Rollout per agent."""

    def __init__(self, agent_ids: list[str]) -> None:
        if len(set(agent_ids)) != len(agent_ids):
            raise ValueError(f"TraceCollector: duplicate agent ids in {agent_ids}")
        self.agent_ids = list(agent_ids)
        self._steps: dict[str, list[Step]] = {aid: [] for aid in agent_ids}
        self._unassigned_reward: dict[str, float] = {aid: 0.0 for aid in agent_ids}

    def _check(self, agent_id: str) -> None:
        if agent_id not in self._steps:
            raise KeyError(f"TraceCollector: unknown agent id {agent_id!r}; known: {self.agent_ids}")

    def record(self, agent_id: str, step: Step) -> None:
        """Append the agent's next step; its index must be the agent's step count."""
        self._check(agent_id)
        expected = len(self._steps[agent_id])
        if step.index != expected:
            raise ValueError(f"step.index is {step.index}, expected {expected} for agent {agent_id!r}")
        self._steps[agent_id].append(step)

    def num_steps(self, agent_id: str) -> int:
        self._check(agent_id)
        return len(self._steps[agent_id])

    def last_step(self, agent_id: str) -> Step | None:
        self._check(agent_id)
        steps = self._steps[agent_id]
        return steps[-1] if steps else None

    def credit_latest(
        self,
        agent_id: str,
        *,
        reward: float = 0.0,
        next_obs: Obs | None = None,
        terminated: bool = False,
        truncated: bool = False,
        info: Info | None = None,
    ) -> None:
        """Fold an off-turn outcome into the agent's latest step.

        Adds ``reward``; sets ``next_obs`` (None once the agent's episode ended); ORs in the
        end flags; adds the ``info`` keys the step does not have yet (e.g. ``result``). Reward reaching an agent before its first step is kept
        in ``rollout.meta["unassigned_reward"]``.
        """
        step = self.last_step(agent_id)
        if step is None:
            self._unassigned_reward[agent_id] += float(reward)
            return
        step.reward += float(reward)
        step.terminated = step.terminated or terminated
        step.truncated = step.truncated or truncated
        step.next_obs = None if (step.terminated or step.truncated) else next_obs
        for key, value in (info or {}).items():
            step.info.setdefault(key, value)

    def rollouts(self, meta: dict[str, Any] | None = None) -> list[Rollout]:
        """One rollout per agent id, in order, each with ``meta["agent_id"]``."""
        out = []
        for aid in self.agent_ids:
            m: dict[str, Any] = {**(meta or {}), "agent_id": aid}
            if self._unassigned_reward[aid]:
                m["unassigned_reward"] = self._unassigned_reward[aid]
            out.append(Rollout(steps=list(self._steps[aid]), meta=m))
        return out
