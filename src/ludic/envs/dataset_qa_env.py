"""One-question QA over a dataset row (GSM8K-style); reward 1.0 for a correct answer.

The env only compares answers; extracting the answer from the model's text is the
agent's parser's job (e.g. ``boxed_parser`` or ``xml_tag_parser("answer")``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ludic.envs.single_agent_env import SingleAgentEnv
from ludic.types import Info, Obs, StepOutcome

_NUMBER = re.compile(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?")


def gsm8k_target_parser(answer: str) -> str:
    """GSM8K answers end with ``#### 42``; return the text after the last ``####``."""
    return answer.rsplit("####", 1)[-1].strip()


def normalize_answer(text: str) -> str:
    """Canonical form for comparison: trimmed, lower case, no thousands commas, no trailing dot/$.

    Numbers compare by value: "3.0", "3" and "$3" all become "3".
    """
    t = text.strip().lower().replace(",", "").rstrip(".").lstrip("$").strip()
    if _NUMBER.fullmatch(t):
        value = float(t)
        return str(int(value)) if value.is_integer() else repr(value)
    return " ".join(t.split())


class DatasetQAEnv(SingleAgentEnv):
    """A single-step episode asking ``sample[question_key]``.

    sample: one dataset row (a mapping with the question and the answer).
    target_parser: turns the raw answer field into the target (e.g. ``gsm8k_target_parser``);
        identity when None.
    Step info: ``correct``, ``parsed_answer`` (the normalised action), ``target_answer``.
    """

    def __init__(
        self,
        sample: Mapping[str, Any],
        target_parser: Callable[[str], str] | None = None,
        *,
        question_key: str = "question",
        answer_key: str = "answer",
        system_prompt: str | None = None,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
    ) -> None:
        for key in (question_key, answer_key):
            if key not in sample:
                raise KeyError(f"DatasetQAEnv: sample has no {key!r} field; fields: {sorted(sample)}")
        self.sample = dict(sample)
        self.question = str(sample[question_key])
        raw = str(sample[answer_key])
        self.target_answer = target_parser(raw) if target_parser is not None else raw.strip()
        self._system_prompt = system_prompt
        self.correct_reward = correct_reward
        self.incorrect_reward = incorrect_reward
        self._done = False

    @property
    def suggested_sysprompt(self) -> str | None:
        return self._system_prompt

    def env_reset(self, *, seed: int | None = None) -> tuple[Obs, Info]:
        self._done = False
        return self.question, {"target_answer": self.target_answer}

    def env_current_obs(self) -> Obs:
        return self.question

    def env_step(self, action: str) -> StepOutcome:
        if self._done:
            raise RuntimeError("DatasetQAEnv: the question was already answered; call reset()")
        self._done = True
        parsed = normalize_answer(action)
        correct = parsed == normalize_answer(self.target_answer)
        info = {"correct": correct, "parsed_answer": parsed, "target_answer": self.target_answer}
        reward = self.correct_reward if correct else self.incorrect_reward
        return StepOutcome(obs=None, reward=reward, truncated=False, terminated=True, info=info)
