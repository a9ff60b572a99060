"""Prompt-prefix sharing gives the plain forward's logits, losses and gradients while computing less."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ludic.training._setup import forward_logits
from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.config import TrainerConfig
from ludic.training.layout.micro_batching import collate_saw_items
from ludic.training.layout.shared_prefix import (
    forward_shared_prefix_logits,
    pack_shared_prefix,
    prompt_groups,
    supports_shared_prefix,
)
from ludic.training.presets import make_grpo
from ludic.training.trainer import Trainer
from ludic.training.types import SAWBatch, SAWItem


def tiny_model(attn: str = "sdpa", seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attn_implementation=attn,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


def grpo_items(groups: int = 3, group_size: int = 4, seed: int = 0, prompt_len: int = 6) -> list[SAWItem]:
    """Shuffled GRPO-style items: prompts of different lengths, completions of different lengths."""
    rng = random.Random(seed)
    items = []
    for g in range(groups):
        prompt = [rng.randrange(2, 64) for _ in range(prompt_len + 3 * g)]
        for k in range(group_size):
            completion = [rng.randrange(2, 64) for _ in range(rng.randrange(1, 9))]
            items.append(
                prompt_completion_item(
                    prompt,
                    completion,
                    weight=rng.uniform(-1, 1),
                    meta={"rollout_id": f"g{g}k{k}"},
                    actor_logps=[rng.uniform(-4.0, -0.5) for _ in completion],
                )
            )
    rng.shuffle(items)
    return items


def view_start(item: SAWItem) -> int:
    return item.action_mask.index(1) - 1


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_the_plain_forward_at_every_view_position(attn):
    model = tiny_model(attn)
    items = grpo_items()
    plain = forward_logits(model, collate_saw_items(items, pad_token_id=0, device="cpu"))
    packed = pack_shared_prefix(items, pad_token_id=0, device="cpu")
    shared = forward_shared_prefix_logits(model, packed)
    for i, item in enumerate(items):
        s, n = view_start(item), len(item.input_ids) - view_start(item)
        torch.testing.assert_close(shared[i, :n], plain[i, s : s + n], atol=2e-5, rtol=1e-4)
        assert packed.view["input_ids"][i, :n].tolist() == item.input_ids[s:]
        assert packed.view["action_mask"][i, :n].sum() == sum(item.action_mask)
    assert packed.computed_tokens < len(items) * max(len(it.input_ids) for it in items)
    assert packed.real_tokens == sum(len(it.input_ids) for it in items)


def test_grpo_loss_and_gradients_match_the_plain_path():
    items = grpo_items(groups=4, group_size=5, seed=1)
    loss_fn = make_grpo(group_size=5).loss
    grads = []
    losses = []
    for shared in (False, True):
        model = tiny_model(seed=3)
        if shared:
            packed = pack_shared_prefix(items, pad_token_id=0, device="cpu")
            batch, logits = packed.view, forward_shared_prefix_logits(model, packed)
        else:
            batch = collate_saw_items(items, pad_token_id=0, device="cpu")
            logits = forward_logits(model, batch)
        loss, _ = loss_fn.compute(logits, batch)
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=1e-5)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_items_group_by_identical_prompt_and_odd_items_stay_alone():
    a = SAWItem(input_ids=[5, 6, 7, 8], attention_mask=[1] * 4, action_mask=[0, 0, 1, 1], weight=1.0)
    b = SAWItem(input_ids=[5, 6, 9], attention_mask=[1] * 3, action_mask=[0, 0, 1], weight=1.0)
    other_prompt = SAWItem(input_ids=[5, 7, 9], attention_mask=[1] * 3, action_mask=[0, 0, 1], weight=1.0)
    no_action = SAWItem(input_ids=[5, 6, 7], attention_mask=[1] * 3, action_mask=[0, 0, 0], weight=1.0)
    padded = SAWItem(input_ids=[5, 6, 7], attention_mask=[1, 1, 0], action_mask=[0, 0, 1], weight=1.0)
    groups = prompt_groups([a, b, other_prompt, no_action, padded])
    assert sorted(map(sorted, groups)) == [[0, 1], [2], [3], [4]]


def test_only_models_with_mask_honouring_attention_can_share():
    assert supports_shared_prefix(tiny_model("sdpa"))
    assert supports_shared_prefix(tiny_model("eager"))
    assert not supports_shared_prefix(torch.nn.Linear(2, 2))


class FixedBatches:
    def __init__(self, items: list[SAWItem]) -> None:
        self.items = items

    async def next_batch(self) -> SAWBatch:
        return SAWBatch(items=list(self.items), meta={})


def one_step(items: list[SAWItem], share: bool) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    model = tiny_model(seed=5)
    cfg = TrainerConfig(
        lr=1e-2, max_seq_len=64, micro_token_budget=4096, sync_every_steps=0, share_prompt_prefix=share,
        pack_sequences=share,
    )  # fmt: skip
    trainer = Trainer(model=model, algo=make_grpo(group_size=4), batch_source=FixedBatches(items), cfg=cfg)
    stats = trainer.train_step_sync()
    trainer.close()
    return stats, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_trainer_step_with_shared_prompts_equals_the_plain_step_and_computes_fewer_positions():
    items = grpo_items(groups=3, group_size=4, seed=2, prompt_len=20)
    plain_stats, plain_weights = one_step(items, share=False)
    shared_stats, shared_weights = one_step(items, share=True)
    for name, weight in plain_weights.items():
        torch.testing.assert_close(shared_weights[name], weight, atol=1e-5, rtol=1e-4, msg=name)
    assert shared_stats["train/loss"] == pytest.approx(plain_stats["train/loss"], abs=1e-5)
    assert shared_stats["perf/real_tokens"] == plain_stats["perf/real_tokens"]
    assert shared_stats["perf/computed_tokens"] <= 0.5 * plain_stats["perf/computed_tokens"]
