"""A merged LoRA publish serves exactly the model the trainer runs, or is refused naming why.

``merged_state_dict`` is what every server gets from a LoRA run by default: loaded into a plain copy of
the base architecture it must give the peft model's logits. Two cases used to break that silently: a
``lora_bias=True`` adapter (its bias was dropped) and LoRA on an ``lm_head`` tied to the embedding (the
merged head overwrote the shared embedding on the server).
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from ludic.training._lora import merged_state_dict


def base_model(tied: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


def trained_lora(tied: bool, **lora: object) -> torch.nn.Module:
    """A peft model whose adapters are not at their zero init (as after training)."""
    model = get_peft_model(base_model(tied), LoraConfig(r=4, lora_alpha=8, **lora))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model


def served_logits(state: dict[str, torch.Tensor], tied: bool, ids: torch.Tensor) -> torch.Tensor:
    server = base_model(tied)
    server.load_state_dict(state, strict=True)
    return server(input_ids=ids).logits


IDS = torch.arange(40).view(2, 20) % 64


def test_lora_bias_is_merged_into_the_layer_bias() -> None:
    model = trained_lora(False, target_modules=["q_proj", "v_proj"], lora_bias=True)
    assert model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["default"].bias.abs().sum() > 0
    torch.testing.assert_close(
        served_logits(merged_state_dict(model), False, IDS), model(input_ids=IDS).logits
    )


def test_lora_bias_on_a_layer_without_bias_is_refused() -> None:
    model = trained_lora(False, target_modules=["o_proj"], lora_bias=True)  # Qwen2's o_proj has no bias
    with pytest.raises(ValueError, match=r"o_proj.*without a bias"):
        merged_state_dict(model)


def test_lora_on_a_tied_output_layer_is_refused_naming_the_tie() -> None:
    model = trained_lora(True, target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValueError, match=r"lm_head.*tied to model\.embed_tokens\.weight"):
        merged_state_dict(model)


def test_lora_on_an_untied_output_layer_serves_the_trained_model() -> None:
    model = trained_lora(False, target_modules=["q_proj", "lm_head"])
    torch.testing.assert_close(
        served_logits(merged_state_dict(model), False, IDS), model(input_ids=IDS).logits
    )


def test_tied_model_without_lora_on_the_head_still_merges() -> None:
    model = trained_lora(True, target_modules=["q_proj", "v_proj"])
    state = merged_state_dict(model)
    torch.testing.assert_close(served_logits(state, True, IDS), model(input_ids=IDS).logits)


def test_dora_merges_as_peft_does() -> None:
    model = trained_lora(False, target_modules=["q_proj", "v_proj", "down_proj"], use_dora=True)
    with torch.no_grad():  # a magnitude away from its init (the weight's norm), as after training
        for name, p in model.named_parameters():
            if "lora_magnitude_vector" in name:
                p.mul_(torch.rand_like(p) + 0.5)
    state = merged_state_dict(model)
    torch.testing.assert_close(served_logits(state, False, IDS), model(input_ids=IDS).logits)
