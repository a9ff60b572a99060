"""How a data-set question is asked and where its answer is read from the reply.

A real chat model answers in its own habit ("7 + 5 = 12", then more text); a task states the format it
wants in the prompt and reads the answer from that format before the data set's own scorer sees it.
Both live here, apart from the system prompt (a chat model's template has a default one to keep):

- ``instruction``: text appended to each question (``"Reply with only the number."``), or a
  ``question_template`` holding ``{question}`` once, for any other layout;
- ``answer``: an extractor name: ``"last_number"``, ``"boxed"`` (``\\boxed{...}``), ``"tag:NAME"``
  (``<NAME>...</NAME>``), ``"last_line"``, ``"after:PHRASE"`` (the rest of the line after the last
  ``PHRASE``, a final period dropped: ``"after:The answer is"``); the last match wins. A reply without one scores as a
  wrong answer (the scorer is given an empty answer) and the step's info says ``answer_found=False``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ludic.parsers import last_boxed

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_TAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
MAX_REPLY_CHARS = 1_000_000
"""Replies longer than this are searched in their last MAX_REPLY_CHARS characters (the answer ends them)."""


@dataclass(frozen=True)
class AnswerExtractor:
    """``extract(reply)``: the answer text, or None when the reply holds none; ``write(answer)``: a reply
    holding ``answer`` in this format (what an SFT demonstration of the task says)."""

    name: str
    extract: Callable[[str], str | None]
    write: Callable[[str], str]


def _last_number(reply: str) -> str | None:
    found = _NUMBER.findall(reply)
    return found[-1] if found else None


def _boxed(reply: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (``ludic.parsers.last_boxed``: braces nest, escaped braces are
    content, an unclosed last box is no answer)."""
    content = last_boxed(reply)
    return content.strip() if content is not None else None


def _tag(name: str) -> Callable[[str], str | None]:
    pattern = re.compile(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", re.S)

    def extract(reply: str) -> str | None:
        found = pattern.findall(reply)
        return found[-1].strip() if found else None

    return extract


def _last_line(reply: str) -> str | None:
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


def _after(phrase: str) -> Callable[[str], str | None]:
    def extract(reply: str) -> str | None:
        at = reply.rfind(phrase)
        if at < 0:
            return None
        rest = reply[at + len(phrase) :].split("\n", 1)[0].strip()
        return rest.removesuffix(".").strip() or None

    return extract


def answer_extractor(spec: str) -> AnswerExtractor:
    """The extractor named ``spec``; an unknown name is a ValueError listing the known ones."""
    if not isinstance(spec, str):
        raise ValueError(f"answer: give an extractor name (a string), got {type(spec).__name__}")
    if spec.startswith("tag:"):
        name = spec[len("tag:") :]
        if not _TAG_NAME.fullmatch(name):
            raise ValueError(f"answer: {spec!r} needs a tag name of letters, digits, '_', '.', '-' after 'tag:'")
        return AnswerExtractor(spec, _bounded(_tag(name)), lambda a: f"<{name}>{a}</{name}>")
    if spec.startswith("after:"):
        phrase = spec[len("after:") :]
        if not phrase.strip() or "\n" in phrase:
            raise ValueError(f"answer: {spec!r} needs a one-line phrase after 'after:'")
        return AnswerExtractor(spec, _bounded(_after(phrase)), lambda a: f"{phrase} {a}.")
    simple = {
        "last_number": AnswerExtractor("last_number", _bounded(_last_number), lambda a: a),
        "boxed": AnswerExtractor("boxed", _bounded(_boxed), lambda a: f"\\boxed{{{a}}}"),
        "last_line": AnswerExtractor("last_line", _bounded(_last_line), lambda a: a),
    }
    if spec not in simple:
        raise ValueError(f"answer: unknown extractor {spec!r}; known: {sorted(simple)}, 'tag:NAME' and 'after:PHRASE'")
    return simple[spec]


def _bounded(extract: Callable[[str], str | None]) -> Callable[[str], str | None]:
    def run(reply: str) -> str | None:
        return extract(reply[-MAX_REPLY_CHARS:])

    return run


@dataclass(frozen=True)
class QuestionFormat:
    """The text an episode asks: the question, laid out by ``question_template`` or followed by
    ``instruction`` (one space between them)."""

    instruction: str | None = None
    question_template: str | None = None

    def __post_init__(self) -> None:
        for key in ("instruction", "question_template"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{key}: give non-empty text, got {value!r:.80}")
        if self.instruction is not None and self.question_template is not None:
            raise ValueError("give instruction or question_template, not both (a template can hold both)")
        if self.question_template is not None and self.question_template.count("{question}") != 1:
            raise ValueError(
                "question_template must hold '{question}' exactly once, got "
                f"{self.question_template.count('{question}')}: {self.question_template!r:.120}"
            )

    def render(self, question: str) -> str:
        if self.question_template is not None:  # str.replace: braces in the question stay as they are
            return self.question_template.replace("{question}", question)
        if self.instruction is not None:
            return f"{question} {self.instruction}"
        return question
