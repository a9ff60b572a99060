"""Cascade attention over a group's shared prompt: the fanned-out cache's logits to fp32 rounding, same samples."""

from __future__ import annotations

import pytest
import torch

from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.inference.embedded._generation import BatchGenerator, RowRequest
from ludic.kernels.cpu import decode_attention
from ludic.kernels.cpu.lean_decoder import LeanDecoder, StaticKVCache
from ludic.kernels.cpu.shared_prefix_cache import SharedPrefixKVCache
from ludic.testing import tiny_model_path


def _model(kind: str) -> torch.nn.Module:
    if kind == "qwen2":  # 4 query heads on 2 KV heads
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(str(tiny_model_path())).eval()
    import transformers  # Llama with one KV head per query head (no GQA)

    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=pytest.mark.skipif(
    not decode_attention.available(), reason=f"the kernel cannot run here: {decode_attention.unavailable_reason()}"))])
@pytest.mark.parametrize("kind", ["qwen2", "llama_mha"])
@torch.inference_mode()
def test_shared_prompt_attention_gives_the_fanned_out_logits_to_fp32_rounding(kind, native):
    model = _model(kind)
    torch.manual_seed(1)
    lengths, width = [9, 4, 1], 9  # three prompts, left-padded to 9 columns
    ids = torch.randint(3, 90, (len(lengths), width))
    prompt_mask = torch.stack([torch.arange(width) >= width - n for n in lengths]).long()
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True)
    index = torch.tensor([0, 1, 0, 2, 2, 0, 1])  # rows of each prompt, interleaved
    fanned = StaticKVCache.from_prefill(out.past_key_values, index, prompt_mask[index], width + 8)
    lean = LeanDecoder(model)
    shared = SharedPrefixKVCache(out.past_key_values, index, prompt_mask, 8, native=native, groups=lean.heads // lean.kv_heads)
    assert shared.native == native  # one call of Ludic's kernel a layer, or two SDPA calls
    assert shared.slots == 3 and shared.slot.tolist() == [0, 0, 1, 0, 1, 2, 1]
    cos, sin = lean.rope_tables(width + 8, torch.float32)
    weights, position = lean.bind(), positions[index, -1] + 1
    tokens = out.logits[index, -1].argmax(-1)
    for step in range(7):
        ref = lean.step(weights, tokens, cos[position], sin[position], fanned, width + step)
        got = lean.step(weights, tokens, cos[position], sin[position], shared, width + step)
        assert got.shape == ref.shape
        assert (got - ref).abs().max() < 2e-6, f"step {step}: max difference {(got - ref).abs().max()}"
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
        tokens, position = ref.argmax(-1), position + 1
        if step in (1, 4):  # rows leave: both caches must keep the same rows in the same order
            done = torch.zeros(tokens.shape[0], dtype=torch.bool)
            done[[0, 2] if step == 1 else [1]] = True
            order = fanned.drop(done, width + step + 1)
            assert torch.equal(shared.drop(done, width + step + 1), order)
            tokens, position = tokens[order], position[order]
    assert shared.rows == fanned.rows == 4


@torch.inference_mode()
def test_engine_with_shared_prompts_samples_the_fanned_out_engines_tokens_logprobs_and_endings():
    model = _model("qwen2")
    client = TransformersChatClient(model, tokenizer=tiny_model_path())
    gen = client._generator
    fanned = BatchGenerator(model, gen.tokenizer, gen.eos_ids, gen.pad_id, gen.device, share_prefix=False)
    caches = []
    make_cache = gen._decode_cache
    gen._decode_cache = lambda *a: caches.append(make_cache(*a)) or caches[-1]
    settings = [SamplingConfig(temperature=t, top_p=p, max_tokens=m, seed=i, stop=("q",) if i == 3 else ())
                for i, (t, p, m) in enumerate([(1.0, 1.0, 40), (0.7, 0.9, 25), (0.0, 1.0, 12), (1.2, 1.0, 30)] * 3)]  # fmt: skip
    prompts = [[5, 6, 7, 8], [9] * 11, [40, 41]]  # 3 prompts x 4 rows, different widths (left padding)
    rows = [RowRequest(prompts[i % 3], s) for i, s in enumerate(settings)]
    got, ref = gen.generate(rows), fanned.generate(rows)
    assert len(caches) == 1 and isinstance(caches[0], SharedPrefixKVCache)
    assert caches[0].native == decode_attention.available()  # the default: Ludic's kernel where it runs
    for a, b in zip(got, ref, strict=True):
        assert a.completion_ids == b.completion_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert (a.finish_reason, a.stop_text_end) == (b.finish_reason, b.stop_text_end)
    assert len({len(r.completion_ids) for r in got}) > 2  # rows left the batch at different steps
    distinct = [RowRequest(p, SamplingConfig(max_tokens=3, seed=0)) for p in prompts]
    gen.generate(distinct)  # every prompt distinct: nothing to share, each row its own copy
    assert isinstance(caches[-1], StaticKVCache)


@torch.inference_mode()
def test_shared_cache_holds_each_prompt_once():
    model = _model("qwen2")
    ids = torch.randint(3, 90, (2, 50))
    out = model(input_ids=ids, use_cache=True)
    index = torch.arange(16) % 2
    shared = SharedPrefixKVCache(out.past_key_values, index, torch.ones_like(ids), 20)
    fanned = StaticKVCache.from_prefill(out.past_key_values, index, torch.ones(16, 50, dtype=torch.long), 70)
    held = shared.suffix.numel() + sum(k.numel() + v.numel() for k, v in shared.prefix)
    assert held * 2.5 < fanned.kv.numel()  # 2 x 50 + 16 x 20 columns vs 16 x 70
