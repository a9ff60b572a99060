"""``[sft]`` demonstrations that cannot train as asked are refused with their file, line and field: a
prompt that fills ``max_seq_len`` (truncation would leave no answer token), a batch larger than the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli.demonstrations import demonstration_items, sft_errors
from ludic.config import parse_config
from ludic.testing import tiny_model_path


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path())


def _cfg(demos: Path, *, batch_size: int = 1, max_seq_len: int = 64):
    return parse_config({
        "model": {"path": str(tiny_model_path())},
        "env": {"name": "letter_repeat"},
        "trainer": {"max_seq_len": max_seq_len},
        "sft": {"steps": 1, "batch_size": batch_size, "demonstrations": str(demos)},
    })  # fmt: skip


def _write(path: Path, rows: list[dict | None]) -> Path:
    path.write_text("".join("\r\n" if r is None else json.dumps(r) + "\r\n" for r in rows), encoding="utf-8")
    return path


def test_a_prompt_that_fills_max_seq_len_is_refused_naming_its_line(tmp_path: Path, tokenizer) -> None:
    demos = _write(tmp_path / "d.jsonl", [{"prompt": "q", "answer": "a"}, None, {"prompt": "q " * 200, "answer": "a"}])
    with pytest.raises(ValueError, match=rf"{demos}:3: prompt is \d+ tokens .*max_seq_len = 64:"):
        demonstration_items(_cfg(demos), tokenizer)


def test_short_prompts_keep_every_answer_token_and_nothing_else(tmp_path: Path, tokenizer) -> None:
    rows = [{"prompt": "q\u0000\u001b \u00e9", "answer": "a" * 50}, {"prompt": "x", "answer": "\u200b\U0001f600"}]
    items = demonstration_items(_cfg(_write(tmp_path / "d.jsonl", rows), batch_size=2, max_seq_len=512), tokenizer)
    for item, row in zip(items, rows):
        answer = [*tokenizer.encode(row["answer"], add_special_tokens=False), tokenizer.eos_token_id]
        n = item.meta["prompt_length"]
        assert item.input_ids[n:] == answer and item.action_mask == [0] * n + [1] * len(answer)


def test_a_batch_larger_than_the_file_is_refused_by_the_dry_run(tmp_path: Path) -> None:
    demos = _write(tmp_path / "d.jsonl", [{"prompt": "q", "answer": "a"}, {"prompt": "r", "answer": "b"}])
    assert sft_errors(_cfg(demos, batch_size=2)) == []
    (error,) = sft_errors(_cfg(demos, batch_size=3))
    assert "[sft].batch_size = 3 is more than the 2 demonstrations" in error and str(demos) in error


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('{"prompt": 5, "answer": "a"}', "prompt"),
        ('{"prompt": "q", "answer": "a", "tools": 7}', "tools"),
        ('{"prompt": "q", "answer": "a\\ud800"}', "answer"),
        ('{"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "a"}]}', "prompt[0].content"),
    ],
)
def test_the_dry_run_names_file_line_and_field_of_a_row_the_tokenizer_would_choke_on(
    tmp_path: Path, line: str, field: str
) -> None:
    demos = tmp_path / "d.jsonl"
    demos.write_text('{"prompt": "q", "answer": "a"}\n\n' + line + "\n")
    (error,) = sft_errors(_cfg(demos))
    assert f"ValueError: {demos}:3: Demonstration.{field}" in error
