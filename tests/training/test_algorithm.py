import pytest
import torch

from ludic.training.algorithm import (
    drop_zero_variance_groups,
    drop_zero_weight,
    make_cispo,
    make_grpo,
    make_gspo,
    make_reinforce,
    make_reinforce_baseline,
    make_scalerl,
    make_sft,
    validate_actor_logps,
)
from ludic.training.credit.assigners import (
    ConstantCredit,
    GroupNormalizedReturn,
    HybridNormalizedReturn,
    MonteCarloReturn,
)
from ludic.training.loss import (
    CISPOLoss,
    ClippedSurrogateLoss,
    CompositeLoss,
    MaskedCausalLMCrossEntropyLoss,
    ReinforceLoss,
    TokenClippedSurrogateLoss,
)
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWBatch, SAWItem


def item(
    rid: str, step: int = 0, *, weight: float = 1.0, group=None, reward: float = 0.0, logps: bool = True
):
    meta = {"rollout_id": rid, "step_index": step, "total_reward": reward}
    if group is not None:
        meta["group_id"] = group
    return SAWItem(
        input_ids=[1, 2, 3],
        attention_mask=[1, 1, 1],
        action_mask=[0, 1, 1],
        weight=weight,
        meta=meta,
        attachments=SampleAttachments(ActorTokenLogps([-0.5, -0.5]) if logps else None),
    )


def test_grpo_preset_defaults_match_the_guide():
    algo = make_grpo()
    assert algo.name == "grpo"
    assert isinstance(algo.credit_assigner, GroupNormalizedReturn)
    assert (algo.credit_assigner.group_size, algo.credit_assigner.normalize_adv) == (8, True)
    assert isinstance(algo.loss, TokenClippedSurrogateLoss)
    assert (algo.loss.clip_eps_low, algo.loss.clip_eps_high, algo.loss.length_normalize) == (0.2, 0.27, False)
    assert algo.loss.ratio_clip is None


def test_gspo_and_cispo_preset_defaults_match_the_guide():
    gspo, cispo = make_gspo(), make_cispo()
    assert isinstance(gspo.loss, ClippedSurrogateLoss)
    assert (gspo.loss.clip_eps_low, gspo.loss.clip_eps_high, gspo.loss.length_normalize) == (3e-4, 4e-4, True)
    assert isinstance(cispo.loss, CISPOLoss)
    assert (cispo.loss.clip_eps_low, cispo.loss.clip_eps_high, cispo.loss.length_normalize) == (
        1e6,
        0.2,
        True,
    )
    assert (gspo.name, cispo.name) == ("gspo", "cispo")


def test_reinforce_sft_and_scalerl_presets_bundle_the_right_parts():
    rf = make_reinforce(gamma=0.9)
    assert isinstance(rf.credit_assigner, MonteCarloReturn) and rf.credit_assigner.gamma == 0.9
    assert isinstance(rf.loss, ReinforceLoss) and rf.loss.old_logp_key == "old_logp_action"
    sft = make_sft()
    assert isinstance(sft.credit_assigner, ConstantCredit) and sft.credit_assigner.value == 1.0
    assert isinstance(sft.loss, MaskedCausalLMCrossEntropyLoss) and sft.preprocess is None
    sc = make_scalerl()
    assert isinstance(sc.credit_assigner, HybridNormalizedReturn) and sc.credit_assigner.group_size == 8
    assert isinstance(sc.loss, CISPOLoss)


def test_cispo_with_kl_coeff_adds_a_weighted_kl_term():
    algo = make_cispo(kl_coeff=0.05, ref_model=torch.nn.Linear(1, 1))
    assert isinstance(algo.loss, CompositeLoss)
    assert [(t.name, t.weight) for t in algo.loss.terms] == [("cispo", 1.0), ("kl", 0.05)]


def test_mismatch_guards_pass_through_presets():
    assert make_grpo(tis_cap=2.0).loss.tis_cap == 2.0
    assert make_gspo(mis_threshold=0.3).loss.mis_threshold == 0.3


def test_validate_actor_logps_names_the_item_without_them():
    batch = SAWBatch([item("a"), item("b", 3, logps=False)])
    with pytest.raises(ValueError, match=r"rollout_id='b', step_index=3.*no actor logprobs"):
        validate_actor_logps(batch)
    with pytest.raises(ValueError, match="rollout_id='b'"):
        make_grpo().preprocess(batch)


def test_drop_zero_weight_drops_items_and_recounts_effective_rollouts():
    batch = SAWBatch(
        [item("a", 0, weight=0.0), item("a", 1, weight=1.0), item("b", weight=0.0)], {"target_rollouts": 2}
    )
    out = drop_zero_weight(batch)
    assert out is batch
    assert [(it.meta["rollout_id"], it.meta["step_index"]) for it in out.items] == [("a", 1)]
    assert out.meta == {"target_rollouts": 2, "effective_rollouts": 1}


def test_presets_drop_zero_weight_items_before_validating_their_logprobs():
    # a zero-weight item without actor logprobs would be dropped anyway: it must not fail validation
    batch = SAWBatch([item("a", weight=0.0, logps=False), item("b", weight=1.0)])
    assert [it.meta["rollout_id"] for it in make_cispo(drop_zero_weight=True).preprocess(batch).items] == ["b"]
    bad = SAWBatch([item("a", weight=0.5, logps=False), item("b", weight=1.0)])
    with pytest.raises(ValueError, match=r"rollout_id=.a.*no actor logprobs"):
        make_cispo(drop_zero_weight=True).preprocess(bad)
    zvp = [item("a", group=1, reward=1.0, logps=False), item("b", group=1, reward=1.0, logps=False)]
    kept = [item("c", group=2, reward=0.0), item("d", group=2, reward=1.0)]
    out = make_scalerl(group_size=2).preprocess(SAWBatch(zvp + kept))
    assert [it.meta["rollout_id"] for it in out.items] == ["c", "d"]


def test_preset_drop_zero_weight_flag_adds_the_filter():
    batch = SAWBatch([item("a", weight=0.0), item("b", weight=1.0)])
    assert len(make_grpo(drop_zero_weight=True).preprocess(batch).items) == 1
    batch = SAWBatch([item("a", weight=0.0), item("b", weight=1.0)])
    assert len(make_grpo().preprocess(batch).items) == 2


def test_zero_variance_groups_are_dropped():
    items = [
        item("a", group="g1", reward=1.0),
        item("b", group="g1", reward=1.0),
        item("c", group="g2", reward=0.0),
        item("d", group="g2", reward=1.0),
    ]
    out = drop_zero_variance_groups(SAWBatch(items))
    assert [it.meta["rollout_id"] for it in out.items] == ["c", "d"]
    assert out.meta["effective_rollouts"] == 2
    out2 = make_scalerl().preprocess(SAWBatch(list(items)))
    assert [it.meta["rollout_id"] for it in out2.items] == ["c", "d"]
    assert len(make_scalerl(filter_zvp=False).preprocess(SAWBatch(list(items))).items) == 4


def test_zero_variance_filter_requires_group_id():
    with pytest.raises(ValueError, match=r"rollout_id='a'.*group_id"):
        drop_zero_variance_groups(SAWBatch([item("a")]))


def test_reinforce_baseline_centres_weights_over_the_macro_batch():
    batch = SAWBatch([item("a", weight=3.0), item("b", weight=1.0), item("c", weight=2.0)])
    out = make_reinforce_baseline().preprocess(batch)
    assert [it.weight for it in out.items] == [1.0, -1.0, 0.0]
    batch = SAWBatch([item("a", weight=3.0), item("b", weight=1.0)])
    out = make_reinforce_baseline(normalize_adv=True).preprocess(batch)
    assert [it.weight for it in out.items] == pytest.approx([1.0, -1.0])
