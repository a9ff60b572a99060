"""One-question QA over a dataset row (GSM8K-style); reward 1.0 for a correct answer.

The env only compares answers; extracting the answer from the model's text is the
agent's parser's job (e.g. ``boxed_parser`` or ``xml_tag_parser("answer")``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from ludic.envs.answer_format import QuestionFormat, answer_extractor
from ludic.envs.single_agent_env import SingleAgentEnv
from ludic.types import Info, Obs, StepOutcome

# one unambiguous way to match each number, so a failing match backtracks in linear time
_NUMBER = re.compile(r"([-+]?)(?:(\d+)(?:\.(\d*))?|\.(\d+))(?:[eE]([-+]?\d{1,6}))?")
PLAIN_DIGITS = 100
"""Numbers whose canonical form needs at most this many zeros/fraction digits are written out in full."""


def gsm8k_target_parser(answer: str) -> str:
    """GSM8K answers end with ``#### 42``; return the text after the last ``####``."""
    return answer.rsplit("####", 1)[-1].strip()


def canonical_number(text: str) -> str | None:
    """The exact canonical form of a decimal number, or None if ``text`` is not one.

    Pure string arithmetic, no floats: "3.0", "3", "+3", "0.3e1" all give "3"; "2.50" gives "2.5";
    integers of any length stay exact; "1e999999" stays "1e999999" instead of becoming ``inf``.
    Linear in the length of the text.
    """
    m = _NUMBER.fullmatch(text)
    if m is None:
        return None
    sign, whole, frac, only_frac, exp = m.groups()
    frac = frac if frac is not None else only_frac or ""
    digits = ((whole or "") + frac).lstrip("0")
    if not digits:
        return "0"
    exponent = (int(exp) if exp else 0) - len(frac)
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    if 0 <= exponent <= PLAIN_DIGITS:
        body = stripped + "0" * exponent
    elif -PLAIN_DIGITS <= exponent < 0:
        point = len(stripped) + exponent
        body = stripped[:point] + "." + stripped[point:] if point > 0 else "0." + "0" * -point + stripped
    else:
        body = f"{stripped}e{exponent}"
    return ("-" if sign == "-" else "") + body


def normalize_answer(text: str) -> str:
    """Canonical form for comparison: trimmed, lower case, no thousands commas, no trailing dot/$.

    Numbers compare exactly by value ("3.0", "3" and "$3" all become "3"; see ``canonical_number``).
    """
    t = text.strip().lower().replace(",", "").rstrip(".").lstrip("$").strip()
    number = canonical_number(t)
    return number if number is not None else " ".join(t.split())


def answers_match(answer: str | None, target: str | None) -> bool:
    """True when both are present, non-empty and equal after ``normalize_answer``; a missing
    answer (None, or empty) never matches anything, not even the string "None"."""
    if answer is None or target is None:
        return False
    a, t = normalize_answer(answer), normalize_answer(target)
    return bool(a) and a == t


class DatasetQAEnv(SingleAgentEnv):
    """A single-step episode asking ``sample[question_key]``.

    sample: one dataset row (a mapping with the question and the answer).
    target_parser: turns the raw answer field into the target (e.g. ``gsm8k_target_parser``);
        identity when None.
    Step info: ``correct``, ``parsed_answer`` (the normalised action), ``target_answer``,
    ``question_id`` (the row's ``id``/``question_id``/``idx``, else a hash of the question; also in
    the reset info). A row whose answer is None is never answered correctly.
    reward_fn: ``reward_fn(reply, target, row) -> float`` (a user's own scoring, ``[env].reward``) gives the
        reward instead of ``correct_reward`` / ``incorrect_reward``; ``correct`` stays the exact match.
    instruction / question_template / answer: the answer format the prompt asks for and the extractor that
        reads it (``ludic.envs.answer_format``); ``answer_found`` in the step info says whether it was there.
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
        reward_fn: Callable[[str, str | None, Mapping[str, Any]], float] | None = None,
        instruction: str | None = None,
        question_template: str | None = None,
        answer: str | None = None,
    ) -> None:
        self.question_format = QuestionFormat(instruction, question_template)
        self.extractor = answer_extractor(answer) if answer is not None else None
        self.question_key, self.answer_key, self.target_parser = question_key, answer_key, target_parser
        self.reward_fn = reward_fn
        self._load_sample(sample)
        self._system_prompt = system_prompt
        self.correct_reward = correct_reward
        self.incorrect_reward = incorrect_reward
        self._done = False

    def _load_sample(self, sample: Mapping[str, Any]) -> None:
        """Make ``sample`` the question asked (subclasses that serve many rows call it at reset)."""
        for key in (self.question_key, self.answer_key):
            if key not in sample:
                raise KeyError(f"{type(self).__name__}: sample has no {key!r} field; fields: {sorted(sample)}")
        self.sample = dict(sample)
        self.question = str(sample[self.question_key])
        self.question_id = _question_id(sample, self.question)
        self.target_answer: str | None = self.target_of(sample)

    def target_of(self, sample: Mapping[str, Any]) -> str | None:
        """The target answer of a row (``target_parser`` applied); None when its answer is missing."""
        raw = sample[self.answer_key]
        if raw is None:  # a missing answer stays missing: it must never match a reply "None"
            return None
        return self.target_parser(str(raw)) if self.target_parser is not None else str(raw).strip()

    @property
    def suggested_sysprompt(self) -> str | None:
        return self._system_prompt

    @property
    def prompt(self) -> str:
        """What the episode asks: the question in the task's format (instruction or template applied)."""
        return self.question_format.render(self.question)

    def read_answer(self, reply: str) -> str | None:
        """The answer in ``reply``: the extractor's match (None without one), or the whole reply."""
        return self.extractor.extract(reply) if self.extractor is not None else reply

    def write_answer(self, answer: str) -> str:
        """A reply giving ``answer`` in the task's format (for demonstrations)."""
        return self.extractor.write(answer) if self.extractor is not None else answer

    def env_reset(self, *, seed: int | None = None) -> tuple[Obs, Info]:
        self._done = False
        return self.prompt, {"target_answer": self.target_answer, "question_id": self.question_id}

    def env_current_obs(self) -> Obs:
        return self.prompt

    def env_step(self, action: str) -> StepOutcome:
        if self._done:
            raise RuntimeError("DatasetQAEnv: the question was already answered; call reset()")
        self._done = True
        answer = self.read_answer(action)
        parsed = normalize_answer(answer) if answer is not None else None
        correct = answers_match(answer, self.target_answer)
        info = {
            "correct": correct,
            "answer_found": answer is not None,
            "parsed_answer": parsed,
            "target_answer": self.target_answer,
            "question_id": self.question_id,
        }
        reward = self.correct_reward if correct else self.incorrect_reward
        if self.reward_fn is not None:
            reward = _checked_reward(self.reward_fn, self.reward_fn(action, self.target_answer, dict(self.sample)))
        return StepOutcome(obs=None, reward=reward, truncated=False, terminated=True, info=info)


def _checked_reward(fn: Callable[..., Any], value: Any) -> float:
    """A user reward's value as a finite float; anything else is an error naming the function."""
    if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
        return float(value)
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"
    raise TypeError(f"reward function {name} returned {value!r:.80}; it must return a finite number")


def _question_id(sample: Mapping[str, Any], question: str) -> str:
    """The row's own id (``id``, ``question_id``, ``idx``) when it has one, else a hash of the question."""
    for key in ("id", "question_id", "idx"):
        if sample.get(key) is not None:
            return str(sample[key])
    return "q-" + hashlib.sha256(question.encode("utf-8", errors="replace")).hexdigest()[:16]
