"""A tiny random-init model on a real BPE tokenizer and chat template (token-exact tests).

The byte-level tokenizer of ``tiny_model`` gives one token per byte, so re-tokenising a reply's text
always gives back the sampled ids and a test of the exact-id paths cannot tell "trains the ids it
sampled" from "trains a re-tokenisation". A real BPE tokenizer can: the model may sample ``"Hel"`` +
``"lo"`` where re-encoding the text gives ``"Hello"``. This helper pairs such a tokenizer (e.g.
SmolLM2-135M-Instruct's, 49152 tokens, shipped under ``tests/fixtures/smollm2_tokenizer``) with a
small Llama model of that vocabulary (SmolLM2's architecture), so engines and servers run on it fast.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

_CACHE: dict[tuple, Path] = {}


def load_tokenizer(tokenizer_dir: str | Path) -> Any:
    """The tokenizer in ``tokenizer_dir``; a clear error when it is missing or has no chat template."""
    from transformers import AutoTokenizer

    folder = Path(tokenizer_dir)
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{folder}: no tokenizer.json (a folder written by tokenizer.save_pretrained)")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{folder}: the tokenizer has no chat template")
    return tokenizer


def build_real_tokenizer_model(
    out_dir: str | Path,
    tokenizer_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
) -> Path:
    """Write a random-init Llama model with ``tokenizer_dir``'s vocabulary, and that tokenizer, to ``out_dir``.

    The default (hidden 64, 2 layers) is about 3.2M parameters, almost all of them the tied 49152 x 64
    embedding (``tie_word_embeddings=False`` gives the head its own weights). End of turn is the tokenizer's ``eos_token`` (``<|im_end|>`` for ChatML templates).
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = load_tokenizer(tokenizer_dir)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"{tokenizer_dir}: the tokenizer has no eos_token (the model could never stop)")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id]
    model.generation_config.pad_token_id = pad_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def real_tokenizer_model_path(tokenizer_dir: str | Path, **kwargs: int) -> Path:
    """Build the model once per process (per tokenizer folder and kwargs) into a temp dir and return its path."""
    key = (str(Path(tokenizer_dir).resolve()), *sorted(kwargs.items()))
    if key not in _CACHE:
        out = Path(tempfile.mkdtemp(prefix="ludic-real-tok-model-"))
        atexit.register(shutil.rmtree, out, ignore_errors=True)  # removed when the process ends
        _CACHE[key] = build_real_tokenizer_model(out, tokenizer_dir, **kwargs)
    return _CACHE[key]


def build_successor_model(
    out_dir: str | Path, tokenizer_dir: str | Path, successors: dict[int, int], *, seed: int = 0, hidden_size: int = 64
) -> Path:
    """A real model that, after token ``a``, samples ``successors[a]`` (at any temperature up to about 2).

    So a test can make the engine sample a chosen id sequence, e.g. ``"Hel"`` + ``"lo"`` where
    re-encoding gives ``"Hello"``: every layer's output projections are zero (the last hidden state is
    the normalised embedding of the last token), and the untied head's row ``b`` is a large multiple of
    that normalised embedding of each ``a`` with ``successors[a] == b`` (every other row zero).
    """
    import torch
    from transformers import AutoModelForCausalLM

    folder = build_real_tokenizer_model(
        out_dir, tokenizer_dir, seed=seed, hidden_size=hidden_size, tie_word_embeddings=False
    )
    model = AutoModelForCausalLM.from_pretrained(folder)
    vocab = model.config.vocab_size
    bad = {a: b for a, b in successors.items() if not (0 <= a < vocab and 0 <= b < vocab)}
    if bad:
        raise ValueError(f"successors {bad} name ids outside the vocabulary (0..{vocab - 1})")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
        embed = model.get_input_embeddings().weight
        head = torch.zeros_like(embed)
        for a, b in successors.items():
            normed = embed[a] * torch.rsqrt(embed[a].pow(2).mean() + model.config.rms_norm_eps)
            head[b] += 20.0 * normed / hidden_size  # logit of b after a: 20; after another token: ~20/sqrt(h)
        model.get_output_embeddings().weight.copy_(head)
    model.save_pretrained(folder)
    return folder


def is_canonical(tokenizer: Any, ids: list[int]) -> bool:
    """Whether re-encoding the text of ``ids`` gives back ``ids`` (False: a re-render would train other ids)."""
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return tokenizer.encode(text, add_special_tokens=False) == list(ids)


__all__ = ["build_real_tokenizer_model", "build_successor_model", "is_canonical", "load_tokenizer", "real_tokenizer_model_path"]
