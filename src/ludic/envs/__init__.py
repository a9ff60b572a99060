"""Environments: the multi-agent kernel and single-agent convenience base."""

from ludic.envs.env import LudicEnv
from ludic.envs.single_agent_env import SingleAgentEnv

__all__ = ["LudicEnv", "SingleAgentEnv"]
