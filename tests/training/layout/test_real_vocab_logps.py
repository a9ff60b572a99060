"""The training path's log-probs and gradients at a real vocabulary (SmolLM2's tokenizer, 49,152 ids): packed
rows, block attention, the output layer in vocabulary tiles and activation-capped micro-batches give the
plain path's numbers (full logits of right-padded rows) to fp32 rounding."""

from __future__ import annotations

import torch
from tests.real_tokenizer.ids import TOKENIZER_DIR
from transformers import LlamaConfig, LlamaForCausalLM

from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.layout.forward import (
    activation_bytes_per_token,
    micro_batch_kernels,
    micro_batch_loss,
    plan_micro_batches,
)
from ludic.training.layout.micro_batching import collate_saw_items
from ludic.training.loss import compute_token_logps, head_logps
from ludic.training.presets import make_grpo

CPU = torch.device("cpu")


def items_from_the_real_tokenizer():
    from ludic.testing.real_tokenizer import load_tokenizer

    tok = load_tokenizer(TOKENIZER_DIR)
    items = []
    for q, question in enumerate(["What is 7 + 5?", "Name a colour.", "Say hello in French."]):
        prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         return_dict=False)  # fmt: skip
        for k, reply in enumerate(["7 + 5 = 12", "Blue, like the sky.", "Bonjour !", "I think it is 12<|im_end|>"]):
            ids = tok.encode(reply, add_special_tokens=False)
            items.append(prompt_completion_item(list(prompt), ids, weight=(k - 1.5) / 2 + 0.1 * q,
                                                actor_logps=[-1.0 - 0.1 * i for i in range(len(ids))]))  # fmt: skip
    assert max(max(it.input_ids) for it in items) > 30_000  # ids far into the vocabulary
    return items


def test_the_training_path_equals_full_logits_at_a_real_vocabulary(monkeypatch):
    monkeypatch.setattr(head_logps, "HEAD_TILE_ELEMENTS", 1 << 16)  # tiles of ~2k-6k ids at these few rows
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49_152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         attn_implementation="sdpa")  # fmt: skip
    model = LlamaForCausalLM(config)
    items = items_from_the_real_tokenizer()
    loss_fn = make_grpo(group_size=4).loss

    batch = collate_saw_items(items, pad_token_id=0, device=CPU)  # the plain path: one padded batch, full logits
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    plain_logps = compute_token_logps(logits, batch["input_ids"]) * batch["action_mask"]
    plain_loss, _ = loss_fn.compute_from_logps(plain_logps, batch)
    plain_loss.backward()
    plain_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    budget = 60 * activation_bytes_per_token(model)  # ~60 positions per micro-batch: several of them
    mbs = plan_micro_batches(model, items, micro_token_budget=4096, max_seq_len=128, activation_budget_bytes=budget)
    assert len(mbs) > 2 and all(mb.block_attention for mb in mbs)
    total = torch.zeros(())
    for mb in mbs:
        with micro_batch_kernels(model, mb):
            loss, _, _ = micro_batch_loss(model, loss_fn, mb, pad_token_id=0, device=CPU)
            (loss * len(mb.items) / len(items)).backward()
        total += loss.detach() * len(mb.items) / len(items)
    torch.testing.assert_close(total, plain_loss.detach(), atol=1e-6, rtol=1e-5)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(model.get_parameter(name).grad, grad, atol=1e-6, rtol=1e-4, msg=name)
