"""Re-exports of the agent classes under the ``ludic.agent`` path (upstream Ludic's spelling)."""

from ludic.agents import *  # noqa: F403
from ludic.agents import __all__  # noqa: F401
