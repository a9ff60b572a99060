"""KL to a frozen reference: presets wire kl_coeff to a scorer; the gradient is the formula's."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tests.training.onpolicy import OnPolicySampler, exact_kl, tiny_model

from ludic.training import presets
from ludic.training.config import TrainerConfig
from ludic.training.loss import CompositeLoss, TokenKLLoss, compute_token_logps
from ludic.training.presets import make_cispo
from ludic.training.reference.scoring import FrozenModelScorer
from ludic.training.trainer import Trainer
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWBatch, SAWItem

RL_PRESETS = ["make_reinforce", "make_reinforce_baseline", "make_grpo", "make_gspo", "make_cispo", "make_scalerl"]


def grad_of(loss_fn, logits: torch.Tensor, batch: dict) -> torch.Tensor:
    leaf = logits.clone().requires_grad_(True)
    loss, _ = loss_fn.compute(leaf, batch)
    (g,) = torch.autograd.grad(loss, leaf)
    return g


def test_kl_coeff_adds_exactly_the_hand_computed_k2_gradient():
    # One action token: logits [0, 0] give p(x=1) = 0.5; the reference gives it 0.9.
    # k2: L_kl = (ref - logp)^2 / 2, so dL/dlogit_v = -(ref - logp) * (onehot_v - p_v), times kl_coeff.
    logits = torch.zeros(1, 2, 2)
    batch = {
        "input_ids": torch.tensor([[0, 1]]),
        "attention_mask": torch.ones(1, 2, dtype=torch.long),
        "action_mask": torch.tensor([[0, 1]]),
        "weight": torch.tensor([1.0]),
        "actor_logps": torch.tensor([[0.0, math.log(0.5)]]),
        "ref_logps": torch.tensor([[0.0, math.log(0.9)]]),
    }
    with_kl = make_cispo(kl_coeff=0.1, ref_model=tiny_model()).loss
    delta = grad_of(with_kl, logits, batch) - grad_of(make_cispo().loss, logits, batch)
    d = math.log(0.9 / 0.5)  # 0.5878
    want = torch.tensor([[[-0.1 * d * (0 - 0.5), -0.1 * d * (1 - 0.5)], [0.0, 0.0]]])
    torch.testing.assert_close(delta, want)
    assert delta[0, 0, 1].item() == pytest.approx(-0.02939, abs=1e-5)


def test_kl_gradient_matches_the_formula_on_a_random_batch():
    torch.manual_seed(0)
    B, T, V = 3, 6, 7
    logits = torch.randn(B, T, V, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]])
    ids = torch.randint(0, V, (B, T))
    ref = torch.randn(B, T, dtype=torch.float64).clamp(max=-0.1) * mask
    batch = {"input_ids": ids, "action_mask": mask, "ref_logps": ref}
    g = grad_of(TokenKLLoss(length_normalize=True), logits, batch)
    # by hand: L = (1/B) sum_i (1/n_i) sum_t m_it (ref_it - logp_it)^2 / 2
    p = logits.softmax(-1)
    logp = p.log().gather(-1, ids[:, 1:, None]).squeeze(-1)  # position t-1 scores token t
    n = mask.sum(-1, keepdim=True).double()
    dl_dlogp = -(ref[:, 1:] - logp) * mask[:, 1:] / (B * n)  # [B, T-1]
    onehot = torch.nn.functional.one_hot(ids[:, 1:], V).double()
    want = torch.zeros_like(logits)
    want[:, :-1] = dl_dlogp[..., None] * (onehot - p[:, :-1])
    torch.testing.assert_close(g, want)


def test_k3_estimator_and_reported_kl_are_the_k3_formula():
    torch.manual_seed(1)
    logits = torch.randn(2, 5, 6, dtype=torch.float64)
    ids = torch.randint(0, 6, (2, 5))
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]])
    ref = (torch.randn(2, 5, dtype=torch.float64) - 2) * mask
    batch = {"input_ids": ids, "action_mask": mask, "ref_logps": ref}
    leaf = logits.clone().requires_grad_(True)
    loss, stats = TokenKLLoss(estimator="k3", stat_key="kl_ref").compute(leaf, batch)
    d = (ref - compute_token_logps(leaf, ids)) * mask
    k3 = torch.exp(d) - 1 - d
    torch.testing.assert_close(loss, (k3 * mask).sum(-1).mean())
    torch.testing.assert_close(stats["kl_ref"], (k3 * mask).sum() / mask.sum())
    with pytest.raises(ValueError, match="k1's gradient is zero"):
        TokenKLLoss(estimator="k1")


@pytest.mark.parametrize("name", RL_PRESETS)
def test_every_rl_preset_refuses_kl_coeff_without_a_reference(name):
    preset = getattr(presets, name)
    with pytest.raises(ValueError, match=r"kl_coeff=0.1\) needs ref_model="):
        preset(kl_coeff=0.1)
    with pytest.raises(ValueError, match="ref_model was given but kl_coeff=0"):
        preset(ref_model=tiny_model())
    with pytest.raises(ValueError, match="kl_coeff must be a number >= 0"):
        preset(kl_coeff=-1.0, ref_model=tiny_model())
    algo = preset(kl_coeff=0.5, ref_model=tiny_model())
    assert isinstance(algo.loss, CompositeLoss)
    assert [(t.name, t.weight) for t in algo.loss.terms][1] == ("kl", 0.5)
    assert algo.loss.terms[1].loss.ref_logps_key == "ref_logps"


def action_items(model: torch.nn.Module) -> list[SAWItem]:
    """Items with the model's own actor logprobs; rewards push some sequences up, some down."""
    out = []
    for i, (n, w) in enumerate([(8, 1.0), (10, -1.0), (12, 1.0), (9, -1.0)]):
        ids = [(7 * k + 3 * i) % 60 + 2 for k in range(n)]
        mask = [0, 0, 0] + [1] * (n - 3)
        with torch.no_grad():
            x = torch.tensor([ids])
            logps = compute_token_logps(model(input_ids=x).logits, x)[0][torch.tensor(mask).bool()].tolist()
        out.append(
            SAWItem(ids, [1] * n, mask, w, {"rollout_id": f"r{i}"}, SampleAttachments(ActorTokenLogps(logps)))
        )
    return out


def train(kl_coeff: float, steps: int = 10) -> tuple[float, list[dict[str, float]]]:
    policy, ref = tiny_model(), tiny_model()
    kw = {"kl_coeff": kl_coeff, "ref_model": policy} if kl_coeff else {}
    algo = presets.make_reinforce_baseline(**kw)
    cfg = TrainerConfig(lr=1e-2, max_seq_len=32, micro_token_budget=256, seed=0)
    trainer = Trainer(model=policy, algo=algo, batch_source=OnPolicySampler(policy), cfg=cfg)
    stats = [trainer.train_step_sync() for _ in range(steps)]
    trainer.close()
    return exact_kl(policy, ref), stats


def test_a_large_kl_coefficient_keeps_the_policy_near_the_reference_and_reports_kl_ref():
    kl_free, _ = train(0.0)
    kl_held, stats = train(1.0)
    assert kl_free > 0.3  # the reward moved the policy far (measured: ~2 nats per token)
    assert kl_held < 0.1 * kl_free, (kl_held, kl_free)
    assert stats[0]["train/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # first step: policy == reference
    assert stats[-1]["train/kl_ref"] > 1e-4
    assert stats[-1]["train/kl/loss"] > 0


def test_reference_equal_to_the_policy_gives_zero_kl_and_zero_kl_gradient():
    policy = tiny_model()
    items = action_items(policy)
    scorer = FrozenModelScorer(policy)
    batch = scorer(SAWBatch(items=copy.deepcopy(items)))
    from ludic.training.layout.micro_batching import collate_saw_items

    mb = collate_saw_items(batch.items, pad_token_id=0, device="cpu")
    logits = policy(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits.detach()
    g = grad_of(TokenKLLoss(), logits, mb)
    loss, stats = TokenKLLoss(estimator="k3").compute(logits, mb)
    assert g.abs().max().item() < 1e-5
    assert loss.item() == pytest.approx(0.0, abs=1e-8) and stats["kl_mean"].item() == pytest.approx(0.0, abs=1e-8)
    with_kl = make_cispo(kl_coeff=10.0, ref_model=policy).loss
    torch.testing.assert_close(grad_of(with_kl, logits, mb), grad_of(make_cispo().loss, logits, mb), atol=1e-6, rtol=0)
