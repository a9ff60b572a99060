"""The CPU-only kernels are never chosen for CUDA (or any non-CPU) tensors, checked without a GPU.

What each selection function reads is a device: given "cuda" (or meta tensors, which are not on the
CPU) they must pick the plain or library path. ``tests/gpu/test_flex_attention_cuda.py`` checks the
same on real CUDA tensors by watching which ops run.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tests.training.layout.test_packing import build, grpo_items
from transformers import Qwen2Config, Qwen2ForCausalLM

from ludic.inference.embedded import _generation
from ludic.inference.embedded._generation import BatchGenerator
from ludic.kernels.cpu import onednn_linear
from ludic.kernels.cpu.lean_decoder import LeanDecoder
from ludic.kernels.cpu.segment_attention import BLOCKS_KWARG, SEGMENT_ATTENTION
from ludic.training.layout.flex_attention import (
    FLEX_ATTENTION,
    FLEX_MASK_KWARG,
    block_attention,
    block_inputs,
    block_kernel,
    flex_available,
)
from ludic.training.layout.packing import pack_plan, plan_packed_micro_batches
from ludic.training.layout.shared_prefix import prompt_groups

needs_flex = pytest.mark.skipif(not flex_available(), reason="this torch has no FlexAttention")


def test_packed_rows_run_flex_on_cuda_and_bucketed_sdpa_on_the_cpu():
    assert block_kernel("cpu") == "segments"
    assert block_kernel(torch.device("cuda:1")) == ("flex" if flex_available() else None)


@needs_flex
def test_a_model_switched_for_cuda_never_runs_the_segment_kernel():
    model = build("qwen2")
    with block_attention(model, device="cuda"):
        assert model.config._attn_implementation == FLEX_ATTENTION
    with block_attention(model, device="cpu"):
        assert model.config._attn_implementation == SEGMENT_ATTENTION
    assert model.config._attn_implementation == "sdpa"


@needs_flex
def test_inputs_for_cuda_carry_a_block_mask_not_the_cpu_buckets():
    items = grpo_items()
    (plan,) = plan_packed_micro_batches(items, prompt_groups(items), micro_token_budget=4096, dense_attention=False)
    packed = pack_plan(plan, pad_token_id=0, device="cpu", dense_mask=False)
    cuda, cpu = block_inputs(packed, device="cuda"), block_inputs(packed, device="cpu")
    assert FLEX_MASK_KWARG in cuda and BLOCKS_KWARG not in cuda
    assert BLOCKS_KWARG in cpu and FLEX_MASK_KWARG not in cpu


def test_onednn_linears_never_take_tensors_off_the_cpu(monkeypatch):
    def refuse(*args):
        raise AssertionError("OneDNNLinear ran on tensors off the CPU")

    monkeypatch.setattr(onednn_linear.OneDNNLinear, "apply", refuse)
    layer = torch.nn.Linear(64, 64, device="meta")
    x = torch.empty(4096, 64, device="meta")  # enough rows that the CPU would take oneDNN
    assert not onednn_linear.runs_on_onednn(x, layer.weight, layer.bias)
    with onednn_linear.onednn_linears(layer):
        assert layer(x).shape == (4096, 64)


def meta_qwen2() -> torch.nn.Module:
    config = Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64)  # fmt: skip
    with torch.device("meta"):
        return Qwen2ForCausalLM(config)


def test_the_lean_decoder_keeps_oneDNN_packing_and_fusion_to_the_cpu():
    decoder = LeanDecoder(meta_qwen2())
    assert not decoder.packed and decoder.linear is torch.nn.functional.linear
    layers = decoder.bind(32)[1]
    assert len(layers[0].qkv) == 3  # q, k, v apart: no fused copy of the weights off the CPU


def test_the_shared_prefix_cache_is_not_chosen_off_the_cpu(monkeypatch):
    chosen = []
    monkeypatch.setattr(_generation.StaticKVCache, "from_prefill", classmethod(lambda cls, *a: chosen.append("static")))
    monkeypatch.setattr(_generation, "SharedPrefixKVCache", lambda *a: chosen.append("shared"))
    gen = BatchGenerator(meta_qwen2(), None, set(), 0, torch.device("meta"))
    keys = torch.empty(2, 2, 5, 8, device="meta")  # two distinct prompts
    cache = SimpleNamespace(layers=[SimpleNamespace(keys=keys, values=keys)])
    index = torch.tensor([0, 0, 1, 1])  # four rows sharing them: the CPU would share their K/V
    gen._decode_cache(cache, index, torch.ones(4, 5, dtype=torch.long), 8)
    assert chosen == ["static"]
