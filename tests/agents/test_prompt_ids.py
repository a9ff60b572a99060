"""Chat-template ids are reused for identical message lists, and never for clock-reading templates."""

from __future__ import annotations

from transformers import AutoTokenizer

from ludic.inference.template_ids import chat_template_ids
from ludic.testing import tiny_model_path


class CountingTokenizer:
    """Wraps a real tokenizer and counts template renders."""

    def __init__(self, template_suffix: str = "") -> None:
        self.inner = AutoTokenizer.from_pretrained(tiny_model_path())
        self.chat_template = self.inner.chat_template + template_suffix
        self.renders = 0

    def apply_chat_template(self, messages, **kwargs):
        self.renders += 1
        return self.inner.apply_chat_template(messages, **kwargs)


def test_identical_messages_render_once_and_give_the_template_ids():
    tok = CountingTokenizer()
    messages = [{"role": "user", "content": "repeat a"}]
    want = tok.inner.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    first = chat_template_ids(tok, messages)
    first.append(-1)  # callers own their list: mutating it must not poison the cache
    again = chat_template_ids(tok, [{"role": "user", "content": "repeat a"}])
    other = chat_template_ids(tok, [{"role": "user", "content": "repeat b"}])
    assert again == list(want) and other != again
    assert tok.renders == 2


def test_a_changed_template_or_a_clock_reading_one_renders_again():
    tok = CountingTokenizer()
    messages = [{"role": "user", "content": "x"}]
    chat_template_ids(tok, messages)
    tok.chat_template = tok.chat_template + " "
    chat_template_ids(tok, messages)
    assert tok.renders == 2
    clock = CountingTokenizer("{# {{ strftime_now('%d') }} #}")
    chat_template_ids(clock, messages)
    chat_template_ids(clock, messages)
    assert clock.renders == 2
