"""``recomputing_layers``: gated MLPs and RMSNorms that keep less for the backward give autograd's values and
gradients (to fp32 rounding), keep what the formulas say, switch only the layers they match, and are what
the Trainer's micro-batches run on the CPU (and what the activation estimate counts)."""

from __future__ import annotations

import pytest
import torch
from tests.training.layout.test_packing import build, grpo_items
from transformers import LlamaConfig, LlamaForCausalLM

from ludic.kernels.cpu import onednn_linear
from ludic.kernels.cpu.recompute import GatedMLPDown, RMSNormKeepInput, recomputing_layers, switchable_layers
from ludic.training.layout.forward import (
    activation_bytes_per_token,
    micro_batch_kernels,
    micro_batch_loss,
    plan_micro_batches,
)
from ludic.training.presets import make_grpo

CPU = torch.device("cpu")


def llama(seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=80, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    model = LlamaForCausalLM(config)
    for name, p in model.named_parameters():  # norms away from 1, so their weight gradient is not trivial
        if "norm" in name:
            p.data.uniform_(0.5, 1.5)
    return model


def assert_close_to_scale(got: torch.Tensor, want: torch.Tensor, name: str, rel: float = 1e-5) -> None:
    """Equal to fp32 rounding at the tensor's own scale (elements near zero carry others' rounding)."""
    worst = (got - want).abs().max().item()
    assert worst <= rel * want.abs().max().item(), f"{name}: max difference {worst} at scale {want.abs().max().item()}"


def grads_of(model: torch.nn.Module, ids: torch.Tensor, **kw) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with recomputing_layers(model, **kw):
        logits = model(input_ids=ids).logits
        (logits.float().square().mean() + logits[..., 0].sum()).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("onednn", [False, True])
def test_a_model_gives_the_same_logits_and_gradients_as_its_own_layers(onednn) -> None:
    if onednn and not onednn_linear.onednn_available():
        pytest.skip("this torch build has no oneDNN")
    model = llama()
    rows = onednn_linear.MIN_ROWS + 40  # enough rows that the down projection takes oneDNN when asked
    ids = torch.randint(0, 96, (2, rows // 2))
    plain, plain_grads = grads_of(model, ids, enabled=False)
    lean, lean_grads = grads_of(model, ids, onednn=onednn)
    torch.testing.assert_close(lean, plain, rtol=1e-5, atol=1e-5)
    for name, grad in plain_grads.items():
        assert_close_to_scale(lean_grads[name], grad, name)


def test_the_formulas_match_float64_autograd() -> None:
    torch.manual_seed(1)
    g, u = torch.randn(7, 24, dtype=torch.float64, requires_grad=True), torch.randn(7, 24, dtype=torch.float64, requires_grad=True)
    w, b = torch.randn(5, 24, dtype=torch.float64, requires_grad=True), torch.randn(5, dtype=torch.float64, requires_grad=True)
    up = torch.randn(7, 5, dtype=torch.float64)
    want = torch.nn.functional.linear(torch.nn.functional.silu(g) * u, w, b)
    want_grads = torch.autograd.grad((want * up).sum(), (g, u, w, b))
    got = GatedMLPDown.apply(g, u, w, b, False, False)
    got_grads = torch.autograd.grad((got * up).sum(), (g, u, w, b))
    torch.testing.assert_close(got, want)
    for a, e in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, e)
    x, nw = torch.randn(3, 4, 16, dtype=torch.float64, requires_grad=True), torch.rand(16, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, 4, 16, dtype=torch.float64)
    want = nw * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    want_grads = torch.autograd.grad((want * up).sum(), (x, nw))
    got = RMSNormKeepInput.apply(x, nw, 1e-5, False)
    got_grads = torch.autograd.grad((got * up).sum(), (x, nw))
    torch.testing.assert_close(got, want)
    for a, e in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, e)


def saved_bytes(model: torch.nn.Module, ids: torch.Tensor, enabled: bool) -> int:
    """Bytes of the distinct tensors the forward keeps for its backward (parameters excluded)."""
    params = {p.data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params:
            kept[t.data_ptr()] = max(kept.get(t.data_ptr(), 0), t.numel() * t.element_size())
        return t

    with recomputing_layers(model, enabled), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids).logits.sum()
    return sum(kept.values())


def test_the_backward_keeps_two_intermediate_and_two_hidden_sized_tensors_fewer_per_layer_and_token() -> None:
    model = llama(layers=3)
    c, ids = model.config, torch.randint(0, 96, (2, 50))
    tokens = ids.numel()
    plain, lean = saved_bytes(model, ids, False), saved_bytes(model, ids, True)
    per_layer = 2 * c.intermediate_size + 2 * c.hidden_size  # silu(g) and the product; two norms' normalized input
    fewer = (c.num_hidden_layers * per_layer + c.hidden_size) * tokens * 4  # and the final norm's
    assert plain - lean >= fewer
    assert plain - lean <= fewer + (2 * c.num_hidden_layers + 1) * tokens * 4 * 2  # and a few per-row scalars


def test_only_matching_fp32_layers_switch_and_only_inside_the_block() -> None:
    model = llama()
    names = {type(m).__name__ for m in switchable_layers(model)}
    assert names == {"LlamaMLP", "LlamaRMSNorm"}
    assert len(switchable_layers(model)) == 2 * 1 + 2 * 2 + 1  # an MLP and two norms per layer, the final norm
    lora_like = llama()
    for layer in lora_like.model.layers:  # a wrapped down projection (as peft's LoRA does): its own forward
        layer.mlp.down_proj = torch.nn.Sequential(layer.mlp.down_proj)
    assert {type(m).__name__ for m in switchable_layers(lora_like)} == {"LlamaRMSNorm"}
    calls = []
    original = GatedMLPDown.apply
    GatedMLPDown.apply = lambda *a: calls.append(a[0].dtype) or original(*a)  # type: ignore[method-assign]
    try:
        ids = torch.randint(0, 96, (1, 9))
        with recomputing_layers(model):
            model(input_ids=ids)
            model.to(torch.bfloat16)(input_ids=ids)  # bf16: the layers' own forward
        model.float()(input_ids=ids)  # outside the block: the layers' own forward
    finally:
        GatedMLPDown.apply = original  # type: ignore[method-assign]
    assert calls == [torch.float32, torch.float32]
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_the_trainers_micro_batches_recompute_on_the_cpu_and_match_the_plain_path() -> None:
    loss_fn = make_grpo(group_size=4).loss
    results = {}
    for kernels in ("auto", "off"):
        model = build("llama", seed=5)
        mbs = plan_micro_batches(model, grpo_items(seed=3), micro_token_budget=4096, max_seq_len=64, cpu_kernels=kernels)
        for mb in mbs:
            with micro_batch_kernels(model, mb, cpu_kernels=kernels):
                loss, _, _ = micro_batch_loss(model, loss_fn, mb, pad_token_id=0, device=CPU)
                switched = [type(m).__name__ for m in model.modules() if "forward" in m.__dict__]
                loss.backward()
        results[kernels] = (loss.detach(), switched, {n: p.grad.clone() for n, p in model.named_parameters()})
    (loss_on, switched_on, grads_on), (loss_off, switched_off, grads_off) = results["auto"], results["off"]
    assert "LlamaMLP" in switched_on and "LlamaRMSNorm" in switched_on and switched_off == []
    torch.testing.assert_close(loss_on, loss_off, rtol=1e-5, atol=1e-6)
    for name, grad in grads_off.items():
        assert_close_to_scale(grads_on[name], grad, name)


def test_the_activation_estimate_counts_what_the_recomputing_layers_keep() -> None:
    model = llama()
    c = model.config
    assert activation_bytes_per_token(model, "off") == c.num_hidden_layers * (4 * c.intermediate_size + 10 * c.hidden_size) * 4
    assert activation_bytes_per_token(model, "auto") == c.num_hidden_layers * (2 * c.intermediate_size + 8 * c.hidden_size) * 4
