"""``dataset_qa`` files with bad lines: each is an error naming the file and the line, before any episode;
a row that lacks its question is never asked as the text "None"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.registry import ENV_REGISTRY

GOOD = json.dumps({"question": "1 + 1 = ?", "answer": "2"})


def _build(path: Path, text: str | bytes):
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return ENV_REGISTRY.build("dataset_qa", path=str(path))


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (f"{GOOD}\n{{\"question\": \"2 + 2\", \"answer\": \n{GOOD}\n", r"line 2 of .* is not UTF-8 JSON"),
        (f"{GOOD}\n[1, 2]\n", r"line 2 of .* is a JSON list, not an object"),
        (f"{GOOD}\n\"just text\"\n", r"line 2 of .* is a JSON str, not an object"),
        (GOOD.encode() + b"\n" + b'{"question": "\xff", "answer": "1"}\n', r"line 2 of .* is not UTF-8 JSON"),
    ],
)
def test_a_bad_line_is_named_with_its_file_and_line(tmp_path: Path, text: str | bytes, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        _build(tmp_path / "d.jsonl", text)


def test_a_line_without_the_question_is_named_not_asked_as_none(tmp_path: Path) -> None:
    text = f"{GOOD}\n{json.dumps({'answer': '3'})}\n"
    with pytest.raises(KeyError, match=r"row 1 of .* \(line 2\) has no \['question'\] field"):  # was: asks "None"
        _build(tmp_path / "d.jsonl", text)


def test_a_null_question_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"row 0 of .* \(line 1\) has a null 'question'"):
        _build(tmp_path / "d.jsonl", json.dumps({"question": None, "answer": "1"}) + "\n")


def test_blank_lines_are_skipped_and_a_null_answer_stays_unanswerable(tmp_path: Path) -> None:
    env = _build(tmp_path / "d.jsonl", f"\n{GOOD}\n\n{json.dumps({'question': 'q', 'answer': None})}\n")
    assert len(env.rows) == 2
    env.reset(seed=1)
    assert env.step({"agent_0": "None"})["agent_0"].reward == 0.0
