"""The matmul floor of the TRL curve (bench/bench_step_floor.py) counts exactly the model's linear layers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_step_floor import VOCAB, decoding_linears, training_linears
from curve_models import SIZES, qwen2_config


def linear_weights(size: str) -> list[tuple[int, int]]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, tie_word_embeddings=True, **qwen2_config(size)))
    return [tuple(m.weight.shape[::-1]) for m in model.modules() if isinstance(m, nn.Linear)]


@pytest.mark.parametrize("size", list(SIZES))
def test_training_products_are_the_models_linears(size: str) -> None:
    counted = sorted((lin.in_features, lin.out_features) for lin in training_linears(**SIZES[size]) for _ in range(lin.count))
    assert counted == sorted(linear_weights(size))


@pytest.mark.parametrize("size", list(SIZES))
def test_decoding_products_fuse_the_same_weights(size: str) -> None:
    """q/k/v and gate/up fused: fewer products, the same multiply-adds per row."""
    fused = decoding_linears(**SIZES[size])
    assert sum(lin.in_features * lin.out_features * lin.count for lin in fused) == sum(i * o for i, o in linear_weights(size))
    assert sum(lin.count for lin in fused) == 4 * SIZES[size]["num_layers"] + 1  # qkv, o, gate_up, down; head


def test_vocab_is_the_curve_models(tmp_path: Path) -> None:
    """The output layer's width is the vocabulary of the model the curve really builds."""
    from transformers import AutoConfig

    from ludic.testing import build_tiny_model

    config = AutoConfig.from_pretrained(build_tiny_model(tmp_path / "m", **SIZES["0.8M"]))
    assert config.vocab_size == VOCAB
    assert config.tie_word_embeddings
