"""The offline tiny model loads like a real checkpoint and its tokenizer round-trips text."""

import json
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ludic.testing import build_tiny_model, tiny_model_path


def test_tiny_model_reloads_with_from_pretrained_and_round_trips_text():
    path = tiny_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert len(tokenizer) == 259
    assert 0.7e6 < sum(p.numel() for p in model.parameters()) < 0.9e6
    text = "héllo <b> wörld\n 🎉"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_chat_template_uses_single_special_token_ids():
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    im_start, im_end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids[0] == im_start and ids.count(im_end) == 1 and ids.count(im_start) == 2
    assert tokenizer.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token_id == im_end


def test_same_seed_builds_identical_weights(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", seed=3, num_layers=1))
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=3, num_layers=1))
    c = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "c", seed=4, num_layers=1))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_byte_ids_follow_byte_order():
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    for text in ("a", "\n", " ", "é"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == [3 + b for b in text.encode("utf-8")], text


def test_tokenizer_ids_are_the_same_in_another_process(tmp_path):
    """The vocabulary must not depend on per-process hash order: a seed has to name one model."""
    script = (
        "import json, sys; from ludic.testing import build_tiny_model;"
        "from transformers import AutoTokenizer;"
        "p = build_tiny_model(sys.argv[1], num_layers=1);"
        "print(json.dumps(AutoTokenizer.from_pretrained(p).get_vocab()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "other")], capture_output=True, text=True, check=True
    )
    here = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "here", num_layers=1)).get_vocab()
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here
