"""Micro-batches capped by the activations their backward keeps, not only by a token count."""

from __future__ import annotations

import torch
from tests.training.layout.test_packing import build, grpo_items

from ludic.training._setup import enable_gradient_checkpointing
from ludic.training.layout.forward import micro_batch_kernels, micro_batch_loss
from ludic.training.layout.micro_batch_plan import (
    activation_bytes_per_token,
    activation_token_cap,
    plan_micro_batches,
)
from ludic.training.layout.token_arrays import num_tokens
from ludic.training.presets import make_grpo

CPU = torch.device("cpu")


def positions(mb) -> int:
    return len(mb.plan.rows) * mb.plan.row_length if mb.plan is not None else len(mb.items) * max(map(num_tokens, mb.items))


def loss_and_grads(model, items, budget_bytes, keep_head_logits=False):
    mbs = plan_micro_batches(model, items, micro_token_budget=4096, max_seq_len=64, activation_budget_bytes=budget_bytes,
                             keep_head_logits=keep_head_logits)  # fmt: skip
    model.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for mb in mbs:
        with micro_batch_kernels(model, mb, onednn=False):
            loss, _, _ = micro_batch_loss(model, make_grpo(group_size=4).loss, mb, pad_token_id=0, device=CPU)
            (loss * len(mb.items) / len(items)).backward()
        total += loss.detach() * len(mb.items) / len(items)
    return mbs, total, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_estimate_follows_the_config():
    model = build("qwen2")
    c = model.config
    plain = c.num_hidden_layers * (4 * c.intermediate_size + 10 * c.hidden_size) * 4
    assert activation_bytes_per_token(model, "off") == plain
    lean = c.num_hidden_layers * (2 * c.intermediate_size + 8 * c.hidden_size) * 4
    assert activation_bytes_per_token(model) == lean
    logits_row = 4 * c.vocab_size  # the head's kept float32 logits
    assert activation_bytes_per_token(model, keep_head_logits=True) == lean + logits_row
    assert activation_token_cap(model, 100 * (lean + logits_row), keep_head_logits=True) == 100
    assert activation_token_cap(model, None) is None
    assert activation_token_cap(model, 100 * activation_bytes_per_token(model)) == 100


def test_a_budget_splits_the_batch_with_the_same_loss_and_gradients():
    model = build("qwen2", seed=3)
    items = grpo_items(seed=1)
    whole, loss_whole, grads_whole = loss_and_grads(model, items, None)
    per_token = activation_bytes_per_token(model)
    capped, loss_capped, grads_capped = loss_and_grads(model, items, 40 * per_token)
    assert len(whole) == 1 and len(capped) > 2
    longest = max(map(num_tokens, items))
    assert all(positions(mb) <= max(40, longest) for mb in capped)
    key = lambda it: (tuple(it.input_ids), it.weight)  # noqa: E731
    assert sorted(key(it) for mb in capped for it in mb.items) == sorted(map(key, items))
    torch.testing.assert_close(loss_capped, loss_whole, atol=1e-6, rtol=1e-5)
    for name, grad in grads_whole.items():
        torch.testing.assert_close(grads_capped[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_a_budget_below_one_sequence_still_trains_every_sequence_whole():
    model = build("llama")
    items = grpo_items(seed=2)
    mbs = plan_micro_batches(model, items, micro_token_budget=4096, max_seq_len=64, activation_budget_bytes=1)
    assert len(mbs) > 1
    for mb in mbs:  # a 1-byte budget: each micro-batch is at most the longest sequence's positions
        assert positions(mb) <= max(map(num_tokens, items))
    kept = {tuple(it.input_ids) for mb in mbs for it in mb.items}
    assert kept == {tuple(it.input_ids) for it in items}  # none truncated


def test_activation_checkpointing_lifts_the_cap():
    model = build("qwen2")
    enable_gradient_checkpointing(model)
    assert activation_token_cap(model, 1) is None
    assert len(plan_micro_batches(model, grpo_items(), micro_token_budget=4096, max_seq_len=64, activation_budget_bytes=1)) == 1


def test_kept_head_logits_shrink_the_micro_batches_and_train_the_same_gradients():
    model = build("qwen2", seed=5)
    items = grpo_items(seed=3)
    per_token = activation_bytes_per_token(model)
    budget = 40 * (per_token + 4 * model.config.vocab_size)  # 40 positions when the logits are kept too
    results = {keep: loss_and_grads(model, items, budget, keep_head_logits=keep) for keep in (False, True)}
    for keep, (mbs, _, _) in results.items():
        assert {mb.keep_head_logits for mb in mbs} == {keep}
    longest = max(map(num_tokens, items))
    assert all(positions(mb) <= max(40, longest) for mb in results[True][0])
    # the same budget holds fewer positions when each keeps its logits row
    assert activation_token_cap(model, budget, keep_head_logits=True) == 40 < activation_token_cap(model, budget)
    torch.testing.assert_close(results[True][1], results[False][1], atol=1e-6, rtol=1e-5)
    for name, grad in results[False][2].items():
        torch.testing.assert_close(results[True][2][name], grad, atol=1e-6, rtol=1e-4, msg=name)
