"""Build a real, tiny `transformers` causal LM and tokenizer fully offline.

Nothing in Ludic's tests or quickstart downloads from a hub. This helper writes a directory that
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` load exactly as they
would a real checkpoint: a randomly initialised Qwen2 model (~0.8M parameters by default) and a
byte-level tokenizer with no merges (one token per byte, so every string round-trips exactly),
three ChatML specials and a ChatML chat template.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

TOOLS_BLOCK = (
    "{% if tools %}"
    "{{ '# Tools\nYou may call these functions:\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\n' }}{% endfor %}"
    "{{ 'Call one with <tool_call>{\"name\": <name>, \"arguments\": <object>}</tool_call>' }}"
    "{% endif %}"
)
"""Hermes/Qwen-style tool description in the system message (rendered only when ``tools=`` is given)."""

CHATML_TEMPLATE = (
    "{% if tools and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n' }}" + TOOLS_BLOCK + "{{ '<|im_end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{% if loop.first and tools and message['role'] == 'system' %}{{ '\n\n' }}" + TOOLS_BLOCK + "{% endif %}"
    "{% for call in message['tool_calls'] or [] %}"
    "{{ '<tool_call>' + {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson"
    " + '</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML; with ``tools=`` it describes them in the system message and renders an assistant
message's ``tool_calls`` as Hermes ``<tool_call>`` blocks, the same text the model samples."""

_CACHE: dict[tuple, Path] = {}


def byte_level_symbols() -> list[str]:
    """The byte-level alphabet in byte order: entry b is the printable stand-in for byte value b.

    GPT-2's scheme: printable Latin-1 bytes stand for themselves; the other 68 bytes map, in
    order, to chr(256), chr(257), ... Building the vocabulary from this list (not from
    ``ByteLevel.alphabet()``, whose order changes from process to process) gives every run the
    same token ids, so a seed names the same model.
    """
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    symbols, extra = [], 0
    for byte in range(256):
        if byte in printable:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


def _build_tokenizer():
    """A byte-level Qwen2Tokenizer with an empty merge list (transformers 5 reloads qwen2 dirs as this class).

    Ids: the three specials, then byte b at id ``len(SPECIAL_TOKENS) + b``.
    """
    from transformers import Qwen2Tokenizer

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for symbol in byte_level_symbols():
        vocab[symbol] = len(vocab)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=[],
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    # Register the specials as added tokens so "<|im_start|>" in a prompt is one id, not 12 bytes.
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 2048,
) -> Path:
    """Write a tiny Qwen2 model + byte-level ChatML tokenizer to ``out_dir`` and return the path.

    The default (hidden 128, 4 layers) is about 0.8M parameters: fast enough on 2 CPU cores for
    tests and a quickstart that visibly learns in minutes.
    """
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = [eos_id]
    model.generation_config.pad_token_id = pad_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_model_path(**kwargs: int) -> Path:
    """Build a tiny model once per process (per set of kwargs) into a temp dir and return its path."""
    key = tuple(sorted(kwargs.items()))
    if key not in _CACHE:
        out = Path(tempfile.mkdtemp(prefix="ludic-tiny-model-"))
        atexit.register(shutil.rmtree, out, ignore_errors=True)  # removed when the process ends
        _CACHE[key] = build_tiny_model(out, **kwargs)
    return _CACHE[key]
