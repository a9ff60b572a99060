"""(prompt, answer) pairs become SFT items tokenised exactly as the Agent sends the prompt."""

from __future__ import annotations

import pytest

from ludic.inference.template_ids import chat_template_ids
from ludic.testing import tiny_model_path
from ludic.training import sft_item, sft_items


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path())


def test_item_is_templated_prompt_then_answer_then_end_of_turn(tokenizer) -> None:
    item = sft_item(tokenizer, "What comes after b?", "c", system_prompt="Be brief.")
    prompt = chat_template_ids(
        tokenizer,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What comes after b?"}],
    )
    n = len(prompt)
    assert item.input_ids[:n] == prompt
    assert item.input_ids[n:] == [*tokenizer.encode("c", add_special_tokens=False), tokenizer.eos_token_id]
    assert item.action_mask == [0] * n + [1, 1]
    assert item.meta["prompt_length"] == n and item.meta["completion_length"] == 2


def test_message_list_prompts_and_batch_helper(tokenizer) -> None:
    dialog = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "x?"},
    ]
    items = sft_items(tokenizer, [(dialog, "y"), ("z?", "w")], end_of_turn=7)
    assert items[0].input_ids[:-2] == chat_template_ids(tokenizer, dialog)
    assert [it.input_ids[-1] for it in items] == [7, 7]
    assert [it.meta["rollout_id"] for it in items] == ["sft-0", "sft-1"]


def test_empty_answer_and_double_system_prompt_are_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match="non-empty answer"):
        sft_item(tokenizer, "q", "")
    with pytest.raises(ValueError, match="already starts with a system message"):
        sft_item(
            tokenizer,
            [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
            "a",
            system_prompt="t",
        )
