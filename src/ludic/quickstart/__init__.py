"""The quickstart: a tiny policy learns a prompt-dependent task with SFT + GRPO on a laptop CPU."""

from ludic.quickstart.config import QuickstartConfig
from ludic.quickstart.task import LetterRepeatEnv, letter_repeat_reward

__all__ = ["LetterRepeatEnv", "QuickstartConfig", "letter_repeat_reward"]
