"""Padding-free packing gives the padded forward's logits, losses and gradients while computing less."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from ludic.training._setup import forward_logits
from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.layout.forward import MicroBatch, micro_batch_loss, plan_micro_batches
from ludic.training.layout.micro_batching import collate_saw_items, split_items_by_token_budget
from ludic.training.layout.packing import (
    ATTENTION_WEIGHT,
    PACKABLE_MODEL_TYPES,
    pack_plan,
    plan_cost,
    plan_packed_micro_batches,
    supports_packing,
)
from ludic.training.layout.shared_prefix import prompt_groups
from ludic.training.loss import MaskedCausalLMCrossEntropyLoss
from ludic.training.presets import make_grpo
from ludic.training.types import SAWItem

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
ARCHS = {
    "qwen2": lambda attn: Qwen2ForCausalLM(Qwen2Config(**SMALL, num_key_value_heads=2, attn_implementation=attn)),
    "llama": lambda attn: LlamaForCausalLM(LlamaConfig(**SMALL, num_key_value_heads=2, attn_implementation=attn)),
    "qwen3": lambda attn: Qwen3ForCausalLM(
        Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=8, attn_implementation=attn)
    ),
    "mistral": lambda attn: MistralForCausalLM(
        MistralConfig(**SMALL, num_key_value_heads=1, sliding_window=None, attn_implementation=attn)
    ),
}


def build(arch: str, attn: str = "sdpa", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return ARCHS[arch](attn)


def grpo_items(groups: int = 4, group_size: int = 4, seed: int = 0, max_reply: int = 12) -> list[SAWItem]:
    """Shuffled GRPO-style items (prompts and replies of different lengths) plus two lone items."""
    rng = random.Random(seed)
    items = []
    for g in range(groups):
        prompt = [rng.randrange(2, 64) for _ in range(5 + 3 * g)]
        for _ in range(group_size):
            reply = [rng.randrange(2, 64) for _ in range(rng.randrange(1, max_reply))]
            items.append(
                prompt_completion_item(
                    prompt, reply, weight=rng.uniform(-1, 1), actor_logps=[rng.uniform(-4, -0.5) for _ in reply]
                )
            )
    for n in (3, 9):
        items.append(prompt_completion_item([7] * n, [9, 10], weight=0.5, actor_logps=[-1.0, -2.0]))
    rng.shuffle(items)
    return items


def test_every_tested_architecture_is_in_the_packable_list():
    assert set(ARCHS) == set(PACKABLE_MODEL_TYPES)


@pytest.mark.parametrize(
    "arch,attn", [("qwen2", "sdpa"), ("llama", "sdpa"), ("llama", "eager"), ("qwen3", "sdpa"), ("mistral", "sdpa")]
)
def test_packed_rows_give_the_plain_logits_at_every_view_position(arch, attn):
    model = build(arch, attn)
    items = grpo_items()
    plans = plan_packed_micro_batches(items, prompt_groups(items), micro_token_budget=96, row_tokens=40)
    assert len(plans) > 1 and any(len(p.rows) > 1 for p in plans)  # several rows, several micro-batches
    for plan in plans:
        packed = pack_plan(plan, pad_token_id=0, device="cpu")
        out = model(
            input_ids=packed.input_ids, attention_mask=packed.attention_mask, position_ids=packed.position_ids
        ).logits
        R, L, V = out.shape
        assert R * L <= 96
        shared = out.reshape(R * L, V)[packed.gather_index]
        plain = forward_logits(model, collate_saw_items(plan.items, pad_token_id=0, device="cpu"))
        for i, item in enumerate(plan.items):
            n = int(packed.view["attention_mask"][i].sum())
            s = len(item.input_ids) - n
            assert packed.view["input_ids"][i, :n].tolist() == item.input_ids[s:]
            torch.testing.assert_close(shared[i, :n], plain[i, s : s + n], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_packed_loss_and_gradients_equal_the_padded_ones(arch):
    items = grpo_items(seed=1)
    loss_fn = make_grpo(group_size=4).loss
    results = []
    for pack in (False, True):
        model = build(arch, seed=3)
        mbs = plan_micro_batches(model, items, micro_token_budget=128, max_seq_len=64, pack=pack)
        assert all((mb.plan is not None) == pack for mb in mbs)
        total = torch.zeros(())
        for mb in mbs:
            loss, _, _ = micro_batch_loss(model, loss_fn, mb, pad_token_id=0, device=torch.device("cpu"))
            (loss * len(mb.items) / len(items)).backward()
            total = total + loss.detach() * len(mb.items) / len(items)
        results.append((total, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (plain_loss, plain_grads), (packed_loss, packed_grads) = results
    torch.testing.assert_close(packed_loss, plain_loss, atol=1e-6, rtol=1e-5)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_plans_keep_every_item_once_and_rows_within_the_budget():
    items = grpo_items(groups=6, group_size=5, seed=4)
    plans = plan_packed_micro_batches(items, prompt_groups(items), micro_token_budget=120, row_tokens=50)
    seen = [id(it) for p in plans for it in p.items]
    assert sorted(seen) == sorted(id(it) for it in items)
    for p in plans:
        assert len(p.rows) * p.row_length <= 120
        assert sorted(i for row in p.rows for seg in row for i in seg.members) == list(range(len(p.items)))


def length_spread(n: int = 64, max_len: int = 512, seed: int = 0) -> list[SAWItem]:
    """bench_training's spread: lengths U[32, max_len], prompts of 8-24 tokens, no shared prompts."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        length, n_prompt = rng.randint(32, max_len), rng.randint(8, 24)
        prompt = [rng.randrange(3, 250) for _ in range(n_prompt)]
        items.append(prompt_completion_item(prompt, [5] * (length - n_prompt), weight=1.0))
    return items


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_real_over_computed_tokens_is_at_least_098_on_the_benchmark_spread(seed, dense):
    items = length_spread(seed=seed)
    plans = plan_packed_micro_batches(
        items, [[i] for i in range(len(items))], micro_token_budget=4096, dense_attention=dense
    )
    real = sum(len(it.input_ids) for it in items)
    computed = sum(len(p.rows) * p.row_length for p in plans)
    assert real / computed >= 0.98
    assert all(len(p.rows) * p.row_length <= 4096 for p in plans)


def group(prompt_len: int, reply_lens: list[int]) -> list[SAWItem]:
    prompt = list(range(2, 2 + prompt_len))
    return [prompt_completion_item(prompt, [7] * n, weight=1.0) for n in reply_lens]


@pytest.mark.parametrize(
    "prompt_len,replies", [(40, [4, 6, 8, 5]), (4, [40, 30, 35, 38]), (69, [128] * 8), (69, [4] * 8), (3, [1, 1])]
)
def test_sharing_a_prompt_never_costs_more_than_not_sharing_or_padding(prompt_len, replies):
    items = group(prompt_len, replies) + group(prompt_len + 5, replies)
    shared = plan_packed_micro_batches(items, prompt_groups(items), micro_token_budget=4096)
    alone = plan_packed_micro_batches(items, [[i] for i in range(len(items))], micro_token_budget=4096)
    padded = split_items_by_token_budget(items, micro_token_budget=4096, max_seq_len=512)
    padded_cost = sum(
        len(mb) * max(len(it.input_ids) for it in mb) * (1 + ATTENTION_WEIGHT * max(len(it.input_ids) for it in mb))
        for mb in padded
    )
    assert plan_cost(shared) <= plan_cost(alone) <= padded_cost


def test_short_replies_to_a_long_prompt_are_shared():
    items = group(69, [4] * 8) + group(70, [4] * 8)
    (plan,) = plan_packed_micro_batches(items, prompt_groups(items), micro_token_budget=4096)
    assert sum(len(seg.members) > 1 for row in plan.rows for seg in row) == 2
    # each prompt once (less its last token), then 8 tails of 5 tokens: rows of 108 and 109
    assert len(plan.rows) * plan.row_length == 2 * 109  # padded: 16 x 74 = 1184


def test_unsupported_models_and_short_sliding_windows_fall_back_to_padded_rows():
    items = grpo_items()
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    windowed = MistralForCausalLM(MistralConfig(**SMALL, num_key_value_heads=1, sliding_window=8))
    for model in (gpt2, windowed):
        mbs = plan_micro_batches(model, items, micro_token_budget=128, max_seq_len=64)
        assert all(mb.plan is None for mb in mbs)
    assert not supports_packing(windowed, longest=9) and supports_packing(windowed, longest=8)
    assert supports_packing(build("llama"))


def test_items_with_attention_holes_are_trained_padded():
    items = grpo_items()
    holed = SAWItem(input_ids=[5, 6, 7, 8], attention_mask=[1, 0, 1, 1], action_mask=[0, 0, 1, 1], weight=1.0)
    mbs = plan_micro_batches(build("qwen2"), [*items, holed], micro_token_budget=128, max_seq_len=64)
    assert all(mb.plan is None for mb in mbs)
    assert sum(len(mb.items) for mb in mbs) == len(items) + 1


def test_a_loss_that_needs_logits_gets_them_from_packed_rows():
    class LogitLoss:  # not a TokenLogpLoss: reads the logits directly
        def compute(self, logits, batch):
            mask = batch["action_mask"].unsqueeze(-1).float()
            return (logits.float().logsumexp(-1, keepdim=True) * mask).sum() / mask.sum(), {}

    items = grpo_items(seed=5)
    model = build("llama")
    values = []
    for pack in (False, True):
        mbs = plan_micro_batches(model, items, micro_token_budget=4096, max_seq_len=64, pack=pack)
        assert len(mbs) == 1
        loss, _, _ = micro_batch_loss(model, LogitLoss(), mbs[0], pad_token_id=0, device=torch.device("cpu"))
        values.append(loss.detach())
    # the views drop prompt positions, so compare per-action-token means
    torch.testing.assert_close(values[1], values[0], atol=1e-5, rtol=1e-5)


def test_micro_batch_loss_reports_positions_computed():
    items = group(30, [3, 4, 5, 6])
    model = build("qwen2")
    (mb,) = plan_micro_batches(model, items, micro_token_budget=4096, max_seq_len=64)
    sft = MaskedCausalLMCrossEntropyLoss()
    _, _, computed = micro_batch_loss(model, sft, mb, pad_token_id=0, device="cpu")
    assert computed == 29 + (4 + 5 + 6 + 7)  # the prompt once (less its last token), then each tail
    _, _, padded = micro_batch_loss(model, sft, MicroBatch(mb.items), pad_token_id=0, device="cpu")
    assert padded == 4 * 36
