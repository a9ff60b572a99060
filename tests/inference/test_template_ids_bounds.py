"""The chat-template id cache with the real tiny tokenizer: bounded in bytes, not only in entries (Ludic's
server renders the chats its clients send, so a client sending large distinct chats must not pile them up)."""

from __future__ import annotations

import pytest

from ludic.inference import template_ids
from ludic.inference.template_ids import chat_template_ids
from ludic.testing import tiny_model_path


@pytest.fixture
def tokenizer():  # a fresh one per test: its own cache
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_path()))


def _cached_bytes(tokenizer) -> int:
    cache = template_ids._CACHES[tokenizer]
    entries = getattr(cache, "entries", cache)  # (before the bound it was the OrderedDict itself)
    return sum(len(key) + template_ids.__dict__.get("ID_BYTES", 40) * len(ids) for key, ids in entries.items())


def test_large_distinct_chats_stay_within_the_byte_bound(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_ids, "MAX_CACHED_BYTES", 200_000, raising=False)
    for i in range(40):
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": f"{i} " + "a" * 3000}]
        assert chat_template_ids(tokenizer, messages) == chat_template_ids(tokenizer, messages)  # a hit, same ids
    assert _cached_bytes(tokenizer) <= 200_000  # was: all 40 chats kept (4096 entries of any size)
    small = [{"role": "user", "content": "small"}]
    assert chat_template_ids(tokenizer, small) == chat_template_ids(tokenizer, small)


def test_one_chat_larger_than_the_bound_is_rendered_but_not_kept(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_ids, "MAX_CACHED_BYTES", 10_000, raising=False)
    huge = [{"role": "user", "content": "b" * 20_000}]
    ids = chat_template_ids(tokenizer, huge)
    assert len(ids) > 0 and _cached_bytes(tokenizer) <= 10_000
