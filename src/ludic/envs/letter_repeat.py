"""The letter-repeat task (``ludic quickstart``'s; registry name ``letter_repeat``): repeat the
letter named in the prompt a given number of times.

Why this task: the right answer depends on the prompt (26 letters, so a policy that ignores
the prompt scores about 1/26), the reward is dense (partial credit per correct character) so
GRPO groups rarely tie, and completions are a handful of tokens, so a ~1M-parameter model
learns it in minutes on a laptop CPU.
"""

from __future__ import annotations

import random
import string

from ludic.envs.single_agent_env import SingleAgentEnv
from ludic.types import Info, Obs, StepOutcome

LETTERS = string.ascii_lowercase


def letter_for_seed(seed: int, letters: str = LETTERS) -> str:
    """The letter an episode with this env seed asks for (deterministic)."""
    return random.Random(seed).choice(letters)


def prompt_for(letter: str, count: int) -> str:
    return f"Repeat {letter} {count} times."


def target_for(letter: str, count: int) -> str:
    return letter * count


def letter_repeat_reward(completion: str, letter: str, count: int) -> float:
    """Fraction of the target's characters matched position by position.

    reward = #{i < count : completion[i] == letter} / max(count, len(completion)), so extra
    characters cost credit too; in [0, 1], 1 only for exactly ``letter * count``.
    """
    text = completion.strip()
    hits = sum(1 for i, ch in enumerate(text[:count]) if ch == letter)
    return hits / max(count, len(text))


class LetterRepeatEnv(SingleAgentEnv):
    """One-step episode: the observation names a letter, the action must repeat it ``count`` times."""

    def __init__(self, *, count: int = 4, letters: str = LETTERS) -> None:
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"LetterRepeatEnv.count must be an int >= 1, got {count!r}")
        if not letters or len(set(letters)) != len(letters):
            raise ValueError(f"LetterRepeatEnv.letters must be distinct characters, got {letters!r}")
        self.count = count
        self.letters = letters
        self._letter: str | None = None

    def env_reset(self, *, seed: int | None = None) -> tuple[Obs, Info]:
        seed = random.randrange(2**31) if seed is None else seed
        self._letter = letter_for_seed(seed, self.letters)
        return self.env_current_obs(), {
            "letter": self._letter,
            "target": target_for(self._letter, self.count),
        }

    def env_current_obs(self) -> Obs:
        if self._letter is None:
            raise RuntimeError("LetterRepeatEnv: call reset() before reading the observation")
        return prompt_for(self._letter, self.count)

    def env_step(self, action: str) -> StepOutcome:
        if self._letter is None:
            raise RuntimeError("LetterRepeatEnv: call reset() before step()")
        target = target_for(self._letter, self.count)
        reward = letter_repeat_reward(action, self._letter, self.count)
        info = {"target": target, "correct": action.strip() == target, "letter": self._letter}
        return StepOutcome(obs=None, reward=reward, truncated=False, terminated=True, info=info)
