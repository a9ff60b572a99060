"""SFT masks on SmolLM2's real BPE tokenizer and template: a demonstration trains the assistant's tokens and
only they, after exactly the prompt ids the agent sends (SmolLM2's default system prompt included)."""

from __future__ import annotations

from tests.real_tokenizer.ids import EOS

from ludic.inference.template_ids import chat_template_ids
from ludic.training import sft_item, sft_items


def _masked(item) -> list[int]:
    return [t for t, m in zip(item.input_ids, item.action_mask, strict=True) if m]


def test_only_the_answer_and_its_end_of_turn_are_trained(tokenizer) -> None:
    item = sft_item(tokenizer, "What is 7 + 5?", "7 + 5 = 12")
    prompt = chat_template_ids(tokenizer, [{"role": "user", "content": "What is 7 + 5?"}])
    n = len(prompt)
    assert item.input_ids[:n] == prompt and item.action_mask == [0] * n + [1] * (len(item.input_ids) - n)
    assert tokenizer.decode(prompt).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert _masked(item) == [*tokenizer.encode("7 + 5 = 12", add_special_tokens=False), EOS]
    assert tokenizer.decode(_masked(item)) == "7 + 5 = 12<|im_end|>"
    # here the whole conversation's render gives the same ids: the demonstration is the chat, token for token
    full = tokenizer.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}, {"role": "assistant", "content": "7 + 5 = 12"}],
                                         tokenize=True, return_dict=False)  # fmt: skip
    assert item.input_ids == full[:-1]  # all but the template's trailing "\n" after <|im_end|>


def test_a_dialog_demonstration_trains_its_last_reply_only(tokenizer) -> None:
    dialog = [{"role": "user", "content": "Hello world"}, {"role": "assistant", "content": "Hello world"},
              {"role": "user", "content": "Again, louder."}]  # fmt: skip
    (item,) = sft_items(tokenizer, [(dialog, "HELLO WORLD")])
    n = len(chat_template_ids(tokenizer, dialog))
    assert sum(item.action_mask) == len(item.input_ids) - n and item.action_mask[:n] == [0] * n
    assert tokenizer.decode(_masked(item)) == "HELLO WORLD<|im_end|>"  # the earlier reply is prompt, not trained
    assert tokenizer.decode(item.input_ids[:n]).count("Hello world") == 2


def test_where_the_template_would_merge_across_the_turn_the_item_keeps_the_prompt_the_agent_sends(tokenizer) -> None:
    """An answer starting with blank lines: a render of the whole chat merges the generation prompt's "\\n" into
    them, ids the model can never sample after its prompt. The item is the agent's prompt + the answer's ids."""
    messages = [{"role": "user", "content": "What is 7 + 5?"}]
    item = sft_item(tokenizer, "What is 7 + 5?", "\n\n12")
    prompt = chat_template_ids(tokenizer, messages)
    full = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": "\n\n12"}], tokenize=True, return_dict=False)
    assert full[: len(prompt)] != prompt  # the whole-chat render has other ids at the turn's start
    assert item.input_ids[: len(prompt)] == prompt and item.action_mask[: len(prompt)] == [0] * len(prompt)
    assert tokenizer.decode(_masked(item)) == "\n\n12<|im_end|>"
    assert tokenizer.decode(item.input_ids) == tokenizer.decode(full).removesuffix("\n")
