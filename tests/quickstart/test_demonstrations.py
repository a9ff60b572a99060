"""SFT demonstrations are tokenised exactly as the agent will see the prompt, answer masked in."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.envs.letter_repeat import letter_for_seed
from ludic.inference.template_ids import chat_template_ids
from ludic.quickstart.demonstrations import demonstration_item


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    from ludic.testing import build_tiny_model

    path: Path = build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    return AutoTokenizer.from_pretrained(path)


def test_item_is_prompt_then_answer_then_end_of_turn(tokenizer) -> None:
    item = demonstration_item(tokenizer, seed=3, count=4, letters="abcdefgh")
    letter = letter_for_seed(3, "abcdefgh")
    prompt = chat_template_ids(tokenizer, [{"role": "user", "content": f"Repeat {letter} 4 times."}])
    n = len(prompt)
    assert item.input_ids[:n] == prompt
    assert tokenizer.decode(item.input_ids[n:-1]) == letter * 4  # byte-level: one token per letter
    assert item.input_ids[-1] == tokenizer.eos_token_id
    assert item.action_mask == [0] * n + [1] * 5
    assert item.attention_mask == [1] * (n + 5)
    assert item.weight == 1.0
    assert item.meta["completion_length"] == 5
