"""Block attention over packed rows equals the dense-mask path: logits, losses and gradients."""

from __future__ import annotations

import pytest
import torch
from tests.training.layout.test_packing import build, grpo_items
from tests.training.test_trainer import FixedBatchSource

from ludic.kernels.cpu.segment_attention import (
    BLOCKS_KWARG,
    SEGMENT_ATTENTION,
    segment_attention,
    unusable_mask,
)
from ludic.training._setup import enable_gradient_checkpointing
from ludic.training.config import TrainerConfig
from ludic.training.layout.forward import (
    micro_batch_kernels,
    micro_batch_loss,
    micro_batch_token_logps,
    plan_micro_batches,
)
from ludic.training.layout.packing import pack_plan, plan_packed_micro_batches
from ludic.training.layout.shared_prefix import prompt_groups
from ludic.training.presets import make_grpo
from ludic.training.trainer import Trainer

CPU = torch.device("cpu")


def loss_and_grads(arch: str, mode: str, items: list, *, checkpointing: bool = False):
    model = build(arch, seed=3)
    if checkpointing:
        enable_gradient_checkpointing(model)
        model.train()
    mbs = plan_micro_batches(
        model, items, micro_token_budget=128, max_seq_len=64, pack=mode != "padded", block_attention=mode == "blocks"
    )
    assert all(mb.block_attention == (mode == "blocks") for mb in mbs)
    assert all((mb.plan is not None) == (mode != "padded") for mb in mbs)
    loss_fn = make_grpo(group_size=4).loss
    total = torch.zeros(())
    for mb in mbs:
        with micro_batch_kernels(model, mb, onednn=False):
            loss, _, _ = micro_batch_loss(model, loss_fn, mb, pad_token_id=0, device=CPU)
            (loss * len(mb.items) / len(items)).backward()
        total = total + loss.detach() * len(mb.items) / len(items)
    assert model.config._attn_implementation == "sdpa"  # switched back after every block
    return total, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "mistral"])
def test_block_attention_gives_the_padded_loss_and_gradients(arch):
    items = grpo_items(seed=1)
    plain_loss, plain_grads = loss_and_grads(arch, "padded", items)
    for mode in ("dense", "blocks"):
        loss, grads = loss_and_grads(arch, mode, items)
        torch.testing.assert_close(loss, plain_loss, atol=1e-6, rtol=1e-5)
        for name, grad in plain_grads.items():
            torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-4, msg=f"{mode} {name}")


def test_activation_checkpointing_recomputes_through_the_blocks():
    items = grpo_items(seed=2)
    plain_loss, plain_grads = loss_and_grads("qwen2", "padded", items)
    loss, grads = loss_and_grads("qwen2", "blocks", items, checkpointing=True)
    torch.testing.assert_close(loss, plain_loss, atol=1e-6, rtol=1e-5)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_token_logps_of_every_view_equal_the_dense_mask_ones():
    model = build("llama", seed=1)
    items = grpo_items(seed=3, max_reply=30)
    out = {}
    for blocks in (False, True):
        (mb,) = plan_micro_batches(model, items, micro_token_budget=4096, max_seq_len=64, block_attention=blocks)
        with torch.no_grad():
            batch, logps = micro_batch_token_logps(model, mb, pad_token_id=0, device=CPU)
        out[blocks] = {
            (tuple(it.input_ids), it.weight): logps[i][batch["action_mask"][i].bool()] for i, it in enumerate(mb.items)
        }
    assert out[True].keys() == out[False].keys() and len(out[True]) == len(items)
    for key, values in out[False].items():
        torch.testing.assert_close(out[True][key], values, atol=1e-5, rtol=1e-4)


def test_a_model_left_on_sdpa_refuses_the_blocks_instead_of_misreading_them():
    model = build("qwen2")
    items = grpo_items()
    (plan,) = plan_packed_micro_batches(items, prompt_groups(items), micro_token_budget=4096, dense_attention=False)
    packed = pack_plan(plan, pad_token_id=0, device="cpu", dense_mask=False)
    assert packed.attention_mask is None and packed.blocks is not None
    inputs = {"input_ids": packed.input_ids, "position_ids": packed.position_ids, BLOCKS_KWARG: packed.blocks}
    with pytest.raises(RuntimeError):
        model(**inputs, attention_mask=unusable_mask(packed.blocks))
    with segment_attention(model), pytest.raises(ValueError, match=BLOCKS_KWARG):
        model(input_ids=packed.input_ids)  # switched, but called without blocks
    with segment_attention(model):
        assert model.config._attn_implementation == SEGMENT_ATTENTION
        logits = model(**inputs, attention_mask=unusable_mask(packed.blocks)).logits
    assert torch.isfinite(logits).all() and model.config._attn_implementation == "sdpa"


def test_eager_models_keep_the_dense_mask():
    model = build("llama", attn="eager")
    mbs = plan_micro_batches(model, grpo_items(), micro_token_budget=4096, max_seq_len=64)
    assert all(mb.plan is not None and not mb.block_attention for mb in mbs)
    with segment_attention(model):
        assert model.config._attn_implementation == "eager"


def test_trainer_steps_equal_with_and_without_block_attention():
    items = grpo_items(seed=4, max_reply=20)
    weights = []
    for blocks in (True, False):
        model = build("qwen2", seed=5)
        cfg = TrainerConfig(max_seq_len=64, micro_token_budget=4096, block_attention=blocks)
        trainer = Trainer(
            model=model, algo=make_grpo(group_size=4), batch_source=FixedBatchSource(items), cfg=cfg,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.5),  # Adam's first steps amplify rounding
        )  # fmt: skip
        for _ in range(2):
            stats = trainer.train_step_sync()
        assert stats["perf/computed_tokens"] < stats["perf/real_tokens"]  # shared prompts: fewer positions than tokens
        assert 0 <= stats["perf/padding_fraction"] < 1
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
        trainer.close()
    for name, value in weights[1].items():
        torch.testing.assert_close(weights[0][name], value, atol=1e-5, rtol=1e-4, msg=name)
