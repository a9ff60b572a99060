"""``kernels/cpu/tied_embedding.py``: a tied input embedding's gradient goes into ``weight.grad`` row by row,
equal to autograd's, without autograd's dense vocabulary-sized tensor; only where that is safe."""

from __future__ import annotations

import pytest
import torch
from tests.training.layout.test_packing import grpo_items
from tests.training.test_trainer import FixedBatchSource
from torch import nn
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from ludic.kernels.cpu import tied_embedding
from ludic.kernels.cpu.tied_embedding import tied_embedding_grads, tied_input_embedding
from ludic.testing import tiny_model_path
from ludic.training.config import TrainerConfig
from ludic.training.presets import make_grpo
from ludic.training.trainer import Trainer

VOCAB, HIDDEN = 4096, 32


def model(*, tied: bool = True, padding_idx: int | None = 3, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=tied, pad_token_id=padding_idx,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def micro_batches(seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, 64, (2, 12), generator=g) for _ in range(2)]  # few rows of the vocabulary touched
    ids[0][0, :3] = 3  # the padding row: aten gives it no gradient
    ids[1][1, 5] = ids[1][1, 6]  # a repeated token: its rows add up
    return ids


def accumulate(m: nn.Module, enabled: bool) -> dict[str, torch.Tensor]:
    m.zero_grad(set_to_none=True)
    for ids in micro_batches():
        with tied_embedding_grads(m, enabled):
            logits = m(input_ids=ids).logits
            (logits.log_softmax(-1)[..., 7].mean() * 0.5).backward()
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def test_the_gradients_equal_autograds_over_micro_batches_padding_and_repeats() -> None:
    m = model()
    plain, rowwise = accumulate(m, False), accumulate(m, True)
    assert plain.keys() == rowwise.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(rowwise[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert plain["model.embed_tokens.weight"][3].abs().sum() > 0  # the head still trains the padding row
    assert m.model.embed_tokens.forward.__name__ == "forward" and "forward" not in vars(m.model.embed_tokens)  # restored


def test_the_dense_vocabulary_sized_gradient_is_never_built() -> None:
    size = VOCAB * HIDDEN * 4
    for enabled, allocations in ((False, ["aten::mm", "aten::empty", "aten::add"]), (True, ["aten::mm"])):
        m = model()
        with tied_embedding_grads(m, enabled):
            loss = m(input_ids=micro_batches()[0]).logits.log_softmax(-1)[..., 7].mean()
            with torch.profiler.profile(profile_memory=True) as prof:
                loss.backward()
        # the ops that allocated a weight-sized tensor: autograd's are the head's gradient, the embedding's
        # dense one and their sum; row by row, the head's only
        assert [e.name for e in prof.events() if e.self_cpu_memory_usage >= size] == allocations, enabled


def test_off_where_it_would_be_wrong_or_useless() -> None:
    assert tied_input_embedding(model()) is not None
    assert tied_input_embedding(model(tied=False)) is None  # its own gradient would go missing from the head's
    frozen = model()
    frozen.model.embed_tokens.weight.requires_grad_(False)
    assert tied_input_embedding(frozen) is None
    renorm = model()
    renorm.model.embed_tokens.max_norm = 1.0
    assert tied_input_embedding(renorm) is None
    assert tied_input_embedding(nn.Linear(2, 2)) is None


def test_without_grad_the_lookup_is_the_plain_one() -> None:
    m = model()
    ids = micro_batches()[0]
    with torch.no_grad():
        plain = m(input_ids=ids).logits
        with tied_embedding_grads(m):
            assert torch.equal(m(input_ids=ids).logits, plain)


@pytest.mark.parametrize("first", ["head", "embedding"])
def test_either_order_of_the_two_contributions_gives_their_sum(first: str) -> None:
    """The output layer's part reaches ``.grad`` through autograd, the lookup's is added in place: the same sum
    whichever lands first."""
    m = model(padding_idx=None)
    weight, ids = m.model.embed_tokens.weight, micro_batches()[1]
    g = torch.Generator().manual_seed(2)
    upstream, head_coef = torch.randn(*ids.shape, HIDDEN, generator=g), torch.randn(VOCAB, HIDDEN, generator=g)
    expected = head_coef.clone().index_add_(0, ids.reshape(-1), upstream.reshape(-1, HIDDEN))
    m.zero_grad(set_to_none=True)
    with tied_embedding_grads(m):
        parts = {"head": (head_coef * weight).sum(), "embedding": (m.model.embed_tokens(ids) * upstream).sum()}
        for name in (first, "embedding" if first == "head" else "head"):
            parts[name].backward()
    torch.testing.assert_close(weight.grad, expected)


def test_the_trainer_runs_it_on_a_tied_model_and_trains_as_the_plain_path(monkeypatch) -> None:
    """Through the Trainer's micro-batch kernels (``cpu_kernels="auto"``), against ``"off"``: same weights."""
    calls = []
    real = tied_embedding.RowwiseEmbeddingGrad.apply
    monkeypatch.setattr(tied_embedding.RowwiseEmbeddingGrad, "apply", lambda *a: calls.append(1) or real(*a))

    def train(cpu_kernels: str) -> dict[str, torch.Tensor]:
        m = AutoModelForCausalLM.from_pretrained(tiny_model_path()).float()
        assert tied_input_embedding(m) is not None
        cfg = TrainerConfig(max_seq_len=64, micro_token_budget=128, cpu_kernels=cpu_kernels)  # several micro-batches
        trainer = Trainer(model=m, algo=make_grpo(group_size=4), batch_source=FixedBatchSource(grpo_items(seed=4)),
                          cfg=cfg, optimizer=torch.optim.SGD(m.parameters(), lr=0.5))  # fmt: skip
        for _ in range(2):
            trainer.train_step_sync()
        trainer.close()
        return {n: p.detach().clone() for n, p in m.named_parameters()}

    plain = train("off")
    assert not calls
    rowwise = train("auto")
    assert len(calls) >= 4  # every micro-batch of both steps
    for name, value in plain.items():
        torch.testing.assert_close(rowwise[name], value, atol=1e-5, rtol=1e-4, msg=name)
