"""Every preset's numbers on one fixed batch, pinned: refactoring the presets must not move them.

The whole path a preset owns runs: credit assignment on fixed rollouts, preprocessing (filters,
centring, the reference/teacher scorer) and the loss on a tiny model's logits. The literals were
computed before the presets were rebuilt on one helper (``presets._build``), and must stay.
"""

from __future__ import annotations

import copy
import statistics

import pytest
import torch

from ludic.training import make_distill, presets
from ludic.training.layout.micro_batching import collate_saw_items
from ludic.training.loss import compute_token_logps
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWBatch, SAWItem
from ludic.types import Rollout, Step

from .onpolicy import tiny_model

REWARDS = [1.0, 0.0, 0.5, 0.0, 0.25, 1.0, 1.0, 0.0]  # two groups of four
GROUP = 4


def rollouts() -> list[Rollout]:
    out = []
    for i, r in enumerate(REWARDS):
        step = Step(0, "o", "a", "o", r, False, True)
        out.append(Rollout(id=f"r{i}", steps=[step], meta={"request_meta": {"group_id": f"g{i // GROUP}"}}))
    return out


def items_for(algo, policy: torch.nn.Module) -> list[SAWItem]:
    """One item per rollout, weighted by ``algo``'s credit; actor logps a bit off the policy's own."""
    credit = algo.credit_assigner.compute(rollouts())
    out = []
    for i, reward in enumerate(REWARDS):
        n = 7 + i % 3
        ids = [(5 * k + 3 * i) % 60 + 2 for k in range(n)]
        mask = [0, 0, 0] + [1] * (n - 3)
        with torch.no_grad():
            x = torch.tensor([ids])
            own = compute_token_logps(policy(input_ids=x).logits, x)[0][torch.tensor(mask).bool()]
        actor = (own + 0.3 * torch.sin(torch.arange(len(own)) + i)).tolist()  # inference/trainer mismatch
        meta = {"rollout_id": f"r{i}", "group_id": f"g{i // GROUP}", "total_reward": reward}
        out.append(SAWItem(ids, [1] * n, mask, credit[(f"r{i}", 0)], meta, SampleAttachments(ActorTokenLogps(actor))))
    return out


def run(algo, policy: torch.nn.Module) -> tuple[list[float], float, dict[str, float]]:
    """(weights after preprocessing, loss, stats) of ``algo`` on the fixed batch."""
    batch = SAWBatch(items=copy.deepcopy(items_for(algo, policy)))
    if algo.preprocess is not None:
        batch = algo.preprocess(batch)
    mb = collate_saw_items(batch.items, pad_token_id=0, device="cpu")
    with torch.no_grad():
        logits = policy(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
    loss, stats = algo.loss.compute(logits, mb)
    return [it.weight for it in batch.items], float(loss), {k: float(v) for k, v in stats.items()}


def build(name: str, kl: bool):
    ref = tiny_model(1)
    if name == "make_distill":
        return make_distill(ref, reward_coeff=0.0)
    kw = {"kl_coeff": 0.1, "ref_model": ref} if kl else {}
    if name in ("make_grpo", "make_gspo", "make_cispo", "make_scalerl"):
        kw["group_size"] = GROUP
    return getattr(presets, name)(**kw)


GROUP_W = [1.507557, -0.904534, 0.301511, -0.904534, -0.70014, 0.980196, 0.980196, -1.260252]
PINNED = {  # name: (weights after preprocessing, loss without KL, loss with kl_coeff=0.1)
    "make_reinforce": ([1.0, 0.0, 0.5, 0.0, 0.25, 1.0, 1.0, 0.0], 7.678432, 7.685586),
    "make_reinforce_baseline": (
        [0.53125, -0.46875, 0.03125, -0.46875, -0.21875, 0.53125, 0.53125, -0.46875], -1.574496, -1.567342
    ),
    "make_grpo": (GROUP_W, 0.3050985, 0.3122522),
    "make_gspo": (GROUP_W, 0.060535, 0.0619545),
    "make_cispo": (GROUP_W, -0.158976, -0.1575565),
    "make_scalerl": (
        [1.450952, -0.870571, 0.29019, -0.870571, -0.725476, 1.015667, 1.015667, -1.305857], -0.1559331, -0.1545135
    ),
}
KL_REF = 0.013658  # mean per-token k3 of policy tiny_model(0) against reference tiny_model(1)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_every_rl_preset_keeps_its_pinned_weights_and_loss(name):
    weights, plain, with_kl = PINNED[name]
    w, loss, stats = run(build(name, kl=False), tiny_model(0))
    assert w == pytest.approx(weights, abs=1e-5)
    assert loss == pytest.approx(plain, abs=1e-5)
    assert "kl_ref" not in stats
    w, loss, stats = run(build(name, kl=True), tiny_model(0))
    assert w == pytest.approx(weights, abs=1e-5)
    assert loss == pytest.approx(with_kl, abs=1e-5)
    assert stats["kl_ref"] == pytest.approx(KL_REF, abs=1e-6)
    assert stats["kl/weight"] == pytest.approx(0.1)


def test_sft_and_pure_distillation_keep_their_pinned_loss():
    w, loss, stats = run(presets.make_sft(), tiny_model(0))
    assert w == [1.0] * 8 and loss == pytest.approx(20.171144, abs=1e-4)
    assert stats["nll_per_token"] == pytest.approx(4.13767, abs=1e-5)
    w, loss, stats = run(build("make_distill", kl=False), tiny_model(0))
    assert w == [1.0] * 8 and loss == pytest.approx(0.0141951, abs=1e-6)
    assert stats["kl_teacher"] == pytest.approx(KL_REF, abs=1e-6)


def test_distill_reward_term_is_group_normalised_like_grpo_and_cispo():
    """``make_distill(reward_coeff>0)``: A = (R - mean_group) / (std_group + eps), as make_cispo."""
    algo = make_distill(tiny_model(1), reward_coeff=0.5, group_size=GROUP)
    w, _, stats = run(algo, tiny_model(0))
    assert w == pytest.approx(GROUP_W, abs=1e-5)
    first = REWARDS[:GROUP]
    by_hand = (first[0] - statistics.fmean(first)) / (statistics.pstdev(first) + 1e-8)
    assert w[0] == pytest.approx(by_hand, abs=1e-6)  # 1.507557; only centred it was 0.625
    assert run(build("make_cispo", kl=False), tiny_model(0))[0] == pytest.approx(w, abs=1e-7)
    assert stats["reward/clip_frac"] == pytest.approx(0.2564103, abs=1e-6)
