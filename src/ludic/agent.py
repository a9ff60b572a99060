"""Re-exports of the agent classes under the seed's ``ludic.agent`` path."""

from ludic.agents import *  # noqa: F403
from ludic.agents import __all__  # noqa: F401
