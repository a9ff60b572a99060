"""Gradient norm of one GRPO micro-batch with and without ``length_normalize``, by reply length.

    .venv/bin/python bench/bench_length_normalize.py

Same tiny model, same 8 replies (advantages +-1, on-policy), replies of L tokens: the summed
surrogate's gradient grows with L, the averaged one does not. Figures for docs/tutorial.md.
"""

from __future__ import annotations

import torch

from ludic.testing import build_tiny_model
from ludic.training import make_grpo
from ludic.training.batching import prompt_completion_item
from ludic.training.layout import collate_saw_items


def grad_norm(model: torch.nn.Module, length: int, normalize: bool) -> float:
    torch.manual_seed(0)
    items = []
    for i in range(8):
        prompt = [int(x) for x in torch.randint(3, 250, (16,))]
        reply = [int(x) for x in torch.randint(3, 250, (length,))]
        item = prompt_completion_item(
            prompt, reply, weight=1.0 if i % 2 else -1.0, meta={"rollout_id": str(i)}
        )
        with torch.no_grad():
            logps = torch.log_softmax(model(torch.tensor([prompt + reply])).logits[0, :-1], -1)
        actor = logps[len(prompt) - 1 :, :].gather(-1, torch.tensor(reply)[:, None])[:, 0].tolist()
        items.append(
            prompt_completion_item(prompt, reply, weight=item.weight, meta=item.meta, actor_logps=actor)
        )
    batch = collate_saw_items(items, pad_token_id=0, device=torch.device("cpu"))
    model.zero_grad()
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss, _ = make_grpo(group_size=8, length_normalize=normalize).loss.compute(logits, batch)
    loss.backward()
    return float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))


def main() -> None:
    import tempfile

    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="ludic-bench-model-") as tmp:  # removed once loaded
        model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp, seed=0))
    print("| reply tokens | grad norm, length_normalize=False | True | ratio |")
    for length in (4, 16, 64):
        off, on = grad_norm(model, length, False), grad_norm(model, length, True)
        print(f"| {length} | {off:.3f} | {on:.3f} | {off / on:.1f}x |")


if __name__ == "__main__":
    main()
