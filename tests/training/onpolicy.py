"""Test helpers for training: a tiny model, a credit assigner the Trainer must not call, an on-policy sampler."""

from __future__ import annotations

import asyncio

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWBatch, SAWItem


def tiny_model(seed: int = 0, *, layers: int = 2, hidden: int = 32) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 of a few thousand parameters (vocab 64), fixed by ``seed``."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=hidden, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


class NoCredit:
    """Credit is assigned by the batch source, never by the Trainer: calling this is a bug."""

    def compute(self, rollouts: list) -> dict:
        raise AssertionError("the Trainer must not run credit assignment")


PROMPT = [5, 6, 7]


class OnPolicySampler:
    """A BatchSource that samples completions from the current policy; reward = share of token 10.

    On-policy like a real run: the KL estimate only constrains the policy where it samples.
    """

    def __init__(self, model: torch.nn.Module, n: int = 16, length: int = 6, seed: int = 0) -> None:
        self.model, self.n, self.length = model, n, length
        self.gen = torch.Generator().manual_seed(seed)

    async def next_batch(self) -> SAWBatch:
        ids = torch.tensor([PROMPT] * self.n)
        logps = []
        with torch.no_grad():
            for _ in range(self.length):
                lp = self.model(input_ids=ids).logits[:, -1].float().log_softmax(-1)
                tok = torch.multinomial(lp.exp(), 1, generator=self.gen)
                logps.append(lp.gather(-1, tok))
                ids = torch.cat([ids, tok], 1)
        actor = torch.cat(logps, 1)
        items = []
        for i in range(self.n):
            reward = sum(x == 10 for x in ids[i, len(PROMPT) :].tolist()) / self.length
            mask = [0] * len(PROMPT) + [1] * self.length
            attachments = SampleAttachments(ActorTokenLogps(actor[i].tolist()))
            items.append(SAWItem(ids[i].tolist(), [1] * len(mask), mask, reward, {"rollout_id": f"r{i}"}, attachments))
        return SAWBatch(items)


def exact_kl(policy: torch.nn.Module, ref: torch.nn.Module) -> float:
    """Mean over 64 fresh samples' action positions of the full-vocabulary KL(policy || ref)."""
    items = asyncio.run(OnPolicySampler(policy, n=64, seed=123).next_batch()).items
    x = torch.tensor([it.input_ids for it in items])
    with torch.no_grad():
        lp, lq = policy(input_ids=x).logits.log_softmax(-1), ref(input_ids=x).logits.log_softmax(-1)
    kl = (lp.exp() * (lp - lq)).sum(-1)[:, len(PROMPT) - 1 : -1]  # the positions that predict actions
    return kl.mean().item()


class StepIndexedSource:
    """Batch k is a pure function of k, so a resumed run sees the same data as an uninterrupted one.
    ``min_len`` and ``id_offset`` shape the items (3 per batch, 2 prompt tokens each)."""

    def __init__(self, start: int = 0, *, min_len: int = 5, id_offset: int = 2) -> None:
        self.k, self.min_len, self.id_offset = start, min_len, id_offset

    async def next_batch(self) -> SAWBatch:
        self.k += 1
        items = []
        for j in range(3):
            n = self.min_len + (self.k + j) % 4
            ids = [(self.k * 11 + j * 5 + i * 3) % 60 + self.id_offset for i in range(n)]
            w = 1.0 if (self.k + j) % 2 else -0.5
            items.append(SAWItem(ids, [1] * n, [0, 0] + [1] * (n - 2), w, {"rollout_id": f"{self.k}-{j}"}))
        return SAWBatch(items=items, meta={})
