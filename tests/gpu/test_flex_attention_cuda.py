"""On CUDA: packed rows through FlexAttention give the padded path's loss and gradients, and no CPU-only
kernel (oneDNN linears, bucketed segment attention, the lean decoder's oneDNN matmuls, the shared-prefix
cache) runs. Written without a GPU at hand; ``scripts/gpu_check.sh`` runs it."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from ludic.inference.embedded import _generation
from ludic.kernels.cpu import lean_decoder as _lean_decoder
from ludic.kernels.cpu import onednn_linear, segment_attention
from ludic.training._setup import enable_gradient_checkpointing
from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.layout.flex_attention import FLEX_ATTENTION
from ludic.training.layout.forward import micro_batch_kernels, micro_batch_loss, plan_micro_batches
from ludic.training.presets import make_grpo

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def build(arch: str, seed: int = 0) -> torch.nn.Module:
    kw = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, attn_implementation="sdpa")  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**kw)) if arch == "qwen2" else LlamaForCausalLM(LlamaConfig(**kw))
    return model.to(CUDA)


def grpo_items(seed: int = 0) -> list:
    rng = random.Random(seed)
    items = []
    for g in range(4):
        prompt = [rng.randrange(2, 96) for _ in range(20 + 40 * g)]  # rows longer than one 128-token tile
        for _ in range(4):
            reply = [rng.randrange(2, 96) for _ in range(rng.randrange(1, 150))]
            items.append(prompt_completion_item(prompt, reply, weight=rng.uniform(-1, 1), actor_logps=[-1.0] * len(reply)))
    rng.shuffle(items)
    return items


def loss_and_grads(arch: str, mode: str, items: list, checkpointing: bool):
    model = build(arch, seed=3)
    if checkpointing:
        enable_gradient_checkpointing(model)
        model.train()
    mbs = plan_micro_batches(model, items, micro_token_budget=1024, max_seq_len=512, pack=mode != "padded",
                             block_attention=mode == "flex", cuda_packed_max_ratio=None)  # fmt: skip
    assert all(mb.block_attention == (mode == "flex") and (mb.plan is None) == (mode == "padded") for mb in mbs)
    loss_fn, total = make_grpo(group_size=4).loss, torch.zeros((), device=CUDA)
    for mb in mbs:
        with micro_batch_kernels(model, mb):
            if mb.block_attention:
                assert model.config._attn_implementation == FLEX_ATTENTION
            loss, _, _ = micro_batch_loss(model, loss_fn, mb, pad_token_id=0, device=CUDA)
            (loss * len(mb.items) / len(items)).backward()
        total = total + loss.detach() * len(mb.items) / len(items)
    return total, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_flex_packed_rows_give_the_padded_loss_and_gradients(arch, checkpointing):
    torch.backends.cuda.matmul.allow_tf32 = False
    items = grpo_items(seed=1)
    plain_loss, plain_grads = loss_and_grads(arch, "padded", items, checkpointing)
    for mode in ("dense", "flex"):
        loss, grads = loss_and_grads(arch, mode, items, checkpointing)
        torch.testing.assert_close(loss, plain_loss, atol=1e-5, rtol=1e-4)
        for name, grad in plain_grads.items():
            torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-3, msg=f"{mode}: {name}")


def test_the_cuda_training_path_runs_no_cpu_only_kernel(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a CPU-only kernel ran on the CUDA path")

    monkeypatch.setattr(onednn_linear.OneDNNLinear, "apply", refuse)
    monkeypatch.setattr(segment_attention, "register", refuse)
    loss, _ = loss_and_grads("qwen2", "flex", grpo_items(seed=2), checkpointing=True)  # fp32: oneDNN's dtype
    assert torch.isfinite(loss)


def test_the_cuda_engine_runs_no_cpu_only_kernel(monkeypatch):
    from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
    from ludic.testing import tiny_model_path

    def refuse(*args, **kwargs):
        raise AssertionError("a CPU-only kernel ran on the CUDA path")

    for name in ("packed_linear", "pack", "gemm_linear", "pack_for_gemm"):  # oneDNN's packed and Ludic's AVX-512 matmuls
        monkeypatch.setattr(_lean_decoder, name, refuse)
    monkeypatch.setattr(_generation, "SharedPrefixKVCache", refuse)
    client = TransformersChatClient(tiny_model_path(), device="cuda")
    assert client._generator.lean is not None and not client._generator.lean.packed
    reqs = [ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "same prompt"}],
                                  sampling=SamplingConfig(max_tokens=8, seed=i)) for i in range(8)]  # fmt: skip

    async def run() -> list:
        return await asyncio.gather(*[client.complete(r) for r in reqs])

    results = asyncio.run(run())
    assert all(len(r.completion_token_ids) >= 1 for r, _ in results)


def test_the_half_positions_rule_is_a_setting():
    model = build("qwen2")
    prompt = list(range(2, 12))
    items = [prompt_completion_item(prompt, [5] * 60, weight=1.0, actor_logps=[-1.0] * 60) for _ in range(2)]
    # shared 10-token prompt, 2 x 60 tails: 130 positions packed vs 140 padded, above half
    ruled = plan_micro_batches(model, items, micro_token_budget=1024, max_seq_len=128)
    free = plan_micro_batches(model, items, micro_token_budget=1024, max_seq_len=128, cuda_packed_max_ratio=None)
    assert all(mb.plan is None for mb in ruled)
    assert all(mb.plan is not None and mb.block_attention for mb in free)
