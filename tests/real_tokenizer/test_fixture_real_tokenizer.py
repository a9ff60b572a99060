"""The shipped SmolLM2 tokenizer is the real one (BPE, 49152 tokens, its ChatML template), and the models
``ludic.testing.real_tokenizer`` builds on it load and sample as the exact-id tests need."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tests.real_tokenizer.ids import EOS, HELLO_WORLD, HELLO_WORLD_CANONICAL, SUCCESSORS, TOKENIZER_DIR
from transformers import AutoModelForCausalLM, AutoTokenizer

from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.template_ids import chat_template_ids
from ludic.testing.real_tokenizer import (
    build_successor_model,
    is_canonical,
    load_tokenizer,
    real_tokenizer_model_path,
)

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_the_fixture_is_smollm2s_bpe_tokenizer_and_chatml_template(tokenizer) -> None:
    assert len(tokenizer) == 49152
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_start|>", "<|im_end|>", EOS)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}], tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    assert text == (f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
                    "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
    own = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                                        tokenize=False)  # fmt: skip
    assert own == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"  # no default then
    # BPE: merges, digits one by one, and the split the tests build on
    assert tokenizer.encode("Hello world", add_special_tokens=False) == HELLO_WORLD_CANONICAL
    assert tokenizer.encode("12", add_special_tokens=False) == [33, 34]
    assert tokenizer.decode(HELLO_WORLD) == "Hello world"
    assert not is_canonical(tokenizer, HELLO_WORLD) and is_canonical(tokenizer, HELLO_WORLD_CANONICAL)


def test_a_built_model_has_the_vocabulary_and_gives_back_the_same_tokenizer(tokenizer) -> None:
    folder = real_tokenizer_model_path(TOKENIZER_DIR, seed=1)
    assert real_tokenizer_model_path(TOKENIZER_DIR, seed=1) == folder  # built once per process
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.vocab_size == 49152 and model.config.model_type == "llama"
    assert model.config.eos_token_id == EOS and sum(p.numel() for p in model.parameters()) < 4_000_000
    again = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "Hello world, 7 + 5 = 12?"}]
    assert chat_template_ids(again, messages) == chat_template_ids(tokenizer, messages)
    assert again.chat_template == tokenizer.chat_template


def test_the_successor_model_samples_the_chosen_non_canonical_ids(successor_dir: Path, tokenizer) -> None:
    client = TransformersChatClient(successor_dir)
    messages = [{"role": "user", "content": "Say hello."}]

    async def sample(seed: int):
        request = ChatCompletionRequest(model="m", messages=messages, prompt_token_ids=chat_template_ids(tokenizer, messages),
                                        sampling=SamplingConfig(temperature=1.0, max_tokens=8, seed=seed))  # fmt: skip
        response, _ = await client.complete(request)
        return response

    for seed in (0, 1):
        response = asyncio.run(sample(seed))
        assert response.completion_token_ids == [*HELLO_WORLD, EOS]
        assert (response.text, response.finish_reason) == ("Hello world", "stop")


def test_bad_folders_and_successors_are_named_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match=r"outside the vocabulary \(0..49151\)"):
        build_successor_model(tmp_path / "bad", TOKENIZER_DIR, {**SUCCESSORS, 5: 49152})
