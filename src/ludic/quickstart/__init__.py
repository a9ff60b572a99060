"""The quickstart: a tiny policy learns a prompt-dependent task with SFT + GRPO on a laptop CPU."""

from ludic.envs.letter_repeat import LetterRepeatEnv, letter_repeat_reward
from ludic.quickstart.config import QuickstartConfig

__all__ = ["LetterRepeatEnv", "QuickstartConfig", "letter_repeat_reward"]
