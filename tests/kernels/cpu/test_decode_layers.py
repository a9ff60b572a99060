"""Ludic's decoding-layers kernel: a decoding step through every layer in one native call gives the lean
decoder's Python loop's logits and K/V to fp32 rounding (biases, GQA and plain heads, rows leaving, 1 and 2
threads), the engine samples the same tokens with it, the layers and caches it does not take keep the loop,
its refusals, and the fallback where it cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch

from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.inference.embedded._generation import RowRequest
from ludic.kernels import select
from ludic.kernels.cpu import decode_layers, native
from ludic.kernels.cpu.lean_decoder import LeanDecoder, StaticKVCache
from ludic.kernels.cpu.shared_prefix_cache import SharedPrefixKVCache
from ludic.testing import tiny_model_path

needs_kernel = pytest.mark.skipif(
    native.unsupported() is not None, reason=f"the kernel cannot run here: {native.unsupported()}"
)


def _model(kind: str) -> torch.nn.Module:
    if kind == "qwen2":  # 4 query heads of 32 dims on 2 KV heads, biases on q/k/v (given values here)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path())).eval()
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.copy_(torch.randn(proj.bias.shape, generator=gen) * 0.1)
        return model
    import transformers  # Llama with one KV head per query head (no GQA), 16 dims a head, no biases

    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _prefill(model):
    torch.manual_seed(1)
    lengths, width = [9, 4, 1], 9  # three prompts, left-padded to 9 columns
    ids = torch.randint(3, 90, (len(lengths), width))
    prompt_mask = torch.stack([torch.arange(width) >= width - n for n in lengths]).long()
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True)
    index = torch.tensor([0, 1, 0, 2, 2, 0, 1])  # rows of each prompt, interleaved
    return out, index, prompt_mask, positions, width


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["qwen2", "llama_mha"])
@torch.inference_mode()
def test_one_call_gives_the_python_loops_logits_and_cache_to_fp32_rounding(kind, threads):
    model = _model(kind)
    out, index, prompt_mask, positions, width = _prefill(model)
    native_step, loop = LeanDecoder(model), LeanDecoder(model, layers=False)
    assert native_step.native_layers and not loop.native_layers
    groups = loop.heads // loop.kv_heads
    caches = [SharedPrefixKVCache(out.past_key_values, index, prompt_mask, 8, native=True, groups=groups) for _ in range(2)]
    for cache in caches:  # stale suffix values must not leak into the attention
        cache.suffix.normal_()
    cos, sin = loop.rope_tables(width + 8, torch.float32)
    weights, position = loop.bind(), positions[index, -1] + 1
    tokens = out.logits[index, -1].argmax(-1)
    torch.set_num_threads(threads)
    try:
        for step in range(7):
            got = native_step.step(weights, tokens, cos[position], sin[position], caches[0], width + step)
            ref = loop.step(weights, tokens, cos[position], sin[position], caches[1], width + step)
            assert (got - ref).abs().max() < 2e-5 * max(1.0, ref.abs().max().item()), f"step {step}"
            assert torch.equal(got.argmax(-1), ref.argmax(-1))
            live = caches[1].rows
            filled = caches[1].suffix[:, :, :live, :, : step + 1]
            assert torch.allclose(caches[0].suffix[:, :, :live, :, : step + 1], filled, atol=1e-5)
            tokens, position = ref.argmax(-1), position + 1
            if step in (1, 4):  # rows leave: the table's pointers stay valid as the rows move
                done = torch.zeros(tokens.shape[0], dtype=torch.bool)
                done[[0, 2] if step == 1 else [1]] = True
                order = caches[1].drop(done, width + step + 1)
                assert torch.equal(caches[0].drop(done, width + step + 1), order)
                tokens, position = tokens[order], position[order]
    finally:
        torch.set_num_threads(2)
    assert caches[0].layer_table is not None and caches[1].layer_table is None
    assert caches[0].layer_table_for is weights[1]  # built once for the batch's bound layers


@needs_kernel
@torch.inference_mode()
def test_weights_bound_again_mid_batch_get_a_new_table():
    model = _model("llama_mha")
    out, index, prompt_mask, positions, width = _prefill(model)
    lean = LeanDecoder(model)
    cache = SharedPrefixKVCache(out.past_key_values, index, prompt_mask, 8, native=True, groups=1)
    cos, sin = lean.rope_tables(width + 8, torch.float32)
    position, tokens = positions[index, -1] + 1, out.logits[index, -1].argmax(-1)
    first = lean.bind()
    lean.step(first, tokens, cos[position], sin[position], cache, width)
    table = cache.layer_table
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(2.0)  # a weight sync between steps
    second = lean.bind()
    got = lean.step(second, tokens, cos[position + 1], sin[position + 1], cache, width + 1)
    assert cache.layer_table is not table and cache.layer_table_for is second[1]
    check = SharedPrefixKVCache(out.past_key_values, index, prompt_mask, 8, native=True, groups=1)
    loop = LeanDecoder(model, layers=False)
    loop.step(first, tokens, cos[position], sin[position], check, width)
    want = loop.step(second, tokens, cos[position + 1], sin[position + 1], check, width + 1)
    assert (got - want).abs().max() < 2e-5 * max(1.0, want.abs().max().item())


@needs_kernel
@torch.inference_mode()
def test_engine_with_the_kernel_samples_the_loops_tokens_and_logprobs():
    model = _model("qwen2")
    client = TransformersChatClient(model, tokenizer=tiny_model_path())
    gen = client._generator
    assert gen.lean is not None and gen.lean.native_layers
    settings = [SamplingConfig(temperature=t, max_tokens=m, seed=i) for i, (t, m) in enumerate([(1.0, 30), (0.0, 20)] * 4)]
    prompts = [[5, 6, 7, 8], [9] * 11]
    rows = [RowRequest(prompts[i % 2], s) for i, s in enumerate(settings)]
    caches = []
    make_cache = gen._decode_cache
    gen._decode_cache = lambda *a: caches.append(make_cache(*a)) or caches[-1]
    got = gen.generate(rows)
    gen.lean.native_layers = False
    want = gen.generate(rows)
    assert isinstance(caches[0], SharedPrefixKVCache) and caches[0].layer_table is not None  # the kernel ran
    assert caches[1].layer_table is None
    for g, w in zip(got, want, strict=True):
        assert g.completion_ids == w.completion_ids and g.finish_reason == w.finish_reason
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    assert len({len(r.completion_ids) for r in got}) > 1  # rows left the batch at different steps


@needs_kernel
@torch.inference_mode()
def test_layers_and_caches_it_does_not_take_keep_the_python_loop():
    model = _model("llama_mha")
    out, index, prompt_mask, _, width = _prefill(model)
    lean = LeanDecoder(model)
    weights = lean.bind()
    sizes = {"heads": 4, "kv_heads": 4, "head_dim": 16, "scale": 0.25}
    shared = SharedPrefixKVCache(out.past_key_values, index, prompt_mask, 8, native=True, groups=1)
    assert decode_layers.layer_table(weights[1], shared, **sizes) is not None
    fanned = StaticKVCache.from_prefill(out.past_key_values, index, prompt_mask[index], width + 8)
    assert decode_layers.layer_table(weights[1], fanned, **sizes) is None  # another cache
    unpacked = LeanDecoder(model, gemm=False).bind()  # oneDNN's packed layout, not decode_gemm's
    assert decode_layers.layer_table(unpacked[1], shared, **sizes) is None
    sdpa = SharedPrefixKVCache(out.past_key_values, index, prompt_mask, 8, native=False, groups=1)
    assert decode_layers.layer_table(weights[1], sdpa, **sizes) is None  # the cache's two SDPA calls
    assert not LeanDecoder(model, exact=True).native_layers  # bit-for-bit logits need the model's own matmuls


@needs_kernel
@torch.inference_mode()
def test_refuses_what_it_cannot_read_naming_it():
    model = _model("llama_mha")
    out, index, prompt_mask, _, width = _prefill(model)
    lean = LeanDecoder(model)
    cache = SharedPrefixKVCache(out.past_key_values, index, prompt_mask, 8, native=True, groups=1)
    table = decode_layers.layer_table(lean.bind()[1], cache, heads=4, kv_heads=4, head_dim=16, scale=0.25)
    cos, sin = torch.ones(7, 16), torch.zeros(7, 16)
    with pytest.raises(ValueError, match="the cache's live rows"):
        decode_layers.run(table, torch.zeros(6, 64), cos[:6], sin[:6], cache, width)
    with pytest.raises(ValueError, match="contiguous float32"):
        decode_layers.run(table, torch.zeros(7, 64, dtype=torch.float64), cos, sin, cache, width)
    with pytest.raises(ValueError, match="cos and sin must be"):
        decode_layers.run(table, torch.zeros(7, 64), cos[:, :8], sin[:, :8], cache, width)
    with pytest.raises(ValueError, match=r"column 17 is outside the cache's decoded columns \[9, 17\)"):
        decode_layers.run(table, torch.zeros(7, 64), cos, sin, cache, width + 8)


def test_without_a_compiler_the_decoder_keeps_its_loop_and_says_why_once(monkeypatch, fresh_build, caplog):
    monkeypatch.setenv("CXX", str(fresh_build / "no-such-compiler"))
    with caplog.at_level(logging.WARNING, logger="ludic.kernels.cpu.decode_layers"):
        assert not decode_layers.available() and not decode_layers.available()
    assert len([r for r in caplog.records if "decoding layers kernel is off" in r.getMessage()]) == 1
    assert not select("cpu", "auto").decode_layers
    with pytest.raises(RuntimeError, match="the decoding layers kernel is unavailable"):
        decode_layers._lib()
    model = _model("llama_mha")
    with torch.inference_mode():
        out, index, prompt_mask, positions, width = _prefill(model)
        lean = LeanDecoder(model)
        cache = SharedPrefixKVCache(out.past_key_values, index, prompt_mask, 8, native=True, groups=1)
        cos, sin = lean.rope_tables(width + 8, torch.float32)
        position = positions[index, -1] + 1
        logits = lean.step(lean.bind(), out.logits[index, -1].argmax(-1), cos[position], sin[position], cache, width)
    assert cache.layer_table is None and torch.isfinite(logits).all()
