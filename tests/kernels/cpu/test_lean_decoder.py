"""The engine's lean decoding loop: the Hugging Face forward's logits (bit for bit with ``exact``, to fp32
rounding with oneDNN's packed matmuls), generate's greedy tokens."""

from __future__ import annotations

import asyncio

import pytest
import torch

from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
from ludic.inference.embedded._generation import CACHE, BatchGenerator, RowRequest
from ludic.kernels.cpu import decode_gemm
from ludic.kernels.cpu.lean_decoder import LeanDecoder, StaticKVCache, lean_unsupported
from ludic.testing import tiny_model_path


def _config_model(kind: str) -> torch.nn.Module:
    """A random-init model of another Llama-family architecture (4 query heads on 2 KV heads)."""
    import transformers

    common = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    config, model = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[kind]
    torch.manual_seed(0)
    return model(config(**common)).eval()


def _tiny_model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_path())).eval()


def _lean_vs_hf_logits(kind: str, exact: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(lean step's logits, the HF forward's) over 6 decoding steps of 4 left-padded rows."""
    model = _tiny_model() if kind == "qwen2" else _config_model(kind)
    assert lean_unsupported(model) is None
    torch.manual_seed(1)
    lengths, width = [9, 4, 9, 1], 9  # left padding of different widths, one row unpadded
    ids = torch.randint(3, 90, (len(lengths), width))
    mask = torch.stack([torch.arange(width) >= width - n for n in lengths]).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    lean = LeanDecoder(model, exact=exact)
    assert lean.packed == (not exact and torch.backends.mkldnn.is_available())  # fp32 on the CPU: packed by default
    assert lean.gemm == (lean.packed and decode_gemm.available())  # on Ludic's kernel where it runs
    cache = StaticKVCache.from_prefill(getattr(out, CACHE), torch.arange(len(lengths)), mask, width + 8)
    cos, sin = lean.rope_tables(width + 8, torch.float32)
    weights, hf_cache, position = lean.bind(len(lengths)), getattr(out, CACHE), positions[:, -1] + 1
    tokens = out.logits[:, -1].argmax(-1)
    pairs = []
    for step in range(6):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        ref = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=position[:, None],
                    use_cache=True, **{CACHE: hf_cache}).logits[:, -1]  # fmt: skip
        pairs.append((lean.step(weights, tokens, cos[position], sin[position], cache, width + step), ref))
        tokens, position = ref.argmax(-1), position + 1
    return pairs


@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3", "mistral"])
@torch.inference_mode()
def test_exact_lean_step_logits_equal_the_hf_forward_bit_for_bit(kind):
    for step, (got, ref) in enumerate(_lean_vs_hf_logits(kind, exact=True)):
        assert torch.equal(got, ref), f"step {step}: max difference {(got - ref).abs().max()}"


@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3", "mistral"])
@torch.inference_mode()
def test_packed_lean_step_logits_equal_the_hf_forward_to_fp32_rounding(kind):
    for step, (got, ref) in enumerate(_lean_vs_hf_logits(kind, exact=False)):
        assert (got - ref).abs().max() <= 1e-5, f"step {step}: max difference {(got - ref).abs().max()}"
        assert torch.equal(got.argmax(-1), ref.argmax(-1))


def _requests(n: int, **sampling) -> list[ChatCompletionRequest]:
    config = SamplingConfig(**sampling)
    messages = [[{"role": "user", "content": "x" * (1 + 3 * i)}] for i in range(n)]
    return [ChatCompletionRequest(model="tiny", messages=m, sampling=config) for m in messages]


async def test_greedy_engine_output_is_model_generate_greedy_output():
    client = TransformersChatClient(tiny_model_path(), generate_in_thread=False)
    assert client._generator.lean is not None
    requests = _requests(6, temperature=0.0, max_tokens=24)
    responses = await asyncio.gather(*[client.complete(r) for r in requests])
    prompts = [client.prompt_ids_for(r) for r in requests]
    width, pad = max(map(len, prompts)), client.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    out = client.model.generate(input_ids=ids, attention_mask=(ids != pad).long(), do_sample=False,
                                max_new_tokens=24, pad_token_id=pad)  # fmt: skip
    eos = client.tokenizer.eos_token_id
    for (response, _), row in zip(responses, out[:, width:].tolist(), strict=True):
        expected = row[: row.index(eos) + 1] if eos in row else row
        assert response.completion_token_ids == expected


@torch.inference_mode()
def test_lean_and_hf_decoding_sample_the_same_tokens_logprobs_and_endings():
    model = _tiny_model()
    client = TransformersChatClient(model, tokenizer=tiny_model_path())
    gen = client._generator
    hf = BatchGenerator(model, gen.tokenizer, gen.eos_ids, gen.pad_id, gen.device, lean=False)
    assert gen.lean is not None and hf.lean is None
    settings = [  # mixed temperatures, nucleus, greedy, stop strings, caps that end rows at different steps
        SamplingConfig(temperature=0.7, max_tokens=20, seed=1),
        SamplingConfig(temperature=1.0, top_p=0.8, max_tokens=7, seed=2),
        SamplingConfig(temperature=0.0, max_tokens=12),
        SamplingConfig(temperature=1.3, max_tokens=30, stop=tuple("abcdefghijklmnopqrstuvwxyz0123456789"), seed=4),
        SamplingConfig(temperature=1.0, max_tokens=1, seed=5),
        SamplingConfig(temperature=1.0, max_tokens=25, seed=6),
    ]
    prompts = [[5, 6, 7], [9] * 11, [5, 6, 7], [40, 41], [3, 4, 5, 6], [5, 6, 7]]
    rows = [RowRequest(p, s) for p, s in zip(prompts, settings, strict=True)]
    lean_out, hf_out = gen.generate(rows), hf.generate(rows)
    for a, b, s in zip(lean_out, hf_out, settings, strict=True):
        assert a.completion_ids == b.completion_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)
        assert (a.finish_reason, a.stop_text_end) == (b.finish_reason, b.stop_text_end)
        assert len(a.completion_ids) <= s.max_tokens
    assert len(lean_out[4].completion_ids) == 1 and lean_out[3].stop_text_end is not None
    assert len({len(r.completion_ids) for r in lean_out}) > 2  # rows really left the batch at different steps


def test_unsupported_models_decode_through_the_hf_forward():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2)).eval()
    assert "GPT2LMHeadModel" in lean_unsupported(model)
    with pytest.raises(ValueError, match="cannot run this model"):
        LeanDecoder(model)
