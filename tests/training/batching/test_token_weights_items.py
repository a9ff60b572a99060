"""SAW items' per-token weights: validated, collated at their action positions, kept aligned by
packing, kept through every encoding, and honoured by the weight preprocessing steps."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch

from ludic.training.algorithm import center_weights, credit_units, drop_zero_weight
from ludic.training.batching.jsonl import saw_item_from_dict, saw_item_to_dict
from ludic.training.layout.micro_batching import collate_saw_items
from ludic.training.layout.packing import PackPlan, Segment, pack_plan
from ludic.training.parallel.batch import item_from_json, item_to_json
from ludic.training.pipeline.codec import BadEntry, decode_entry, encode_item
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWBatch, SAWItem

# two turns in one sequence: prompt, reply (weight 0.7), observation, reply (weight -0.3)
IDS = [5, 6, 7, 11, 12, 8, 9, 13, 14, 15]
MASK = [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
TOKEN_WEIGHTS = [0.7, 0.7, -0.3, -0.3, -0.3]


def two_turn_item(**changes) -> SAWItem:
    fields = dict(
        input_ids=list(IDS),
        attention_mask=[1] * len(IDS),
        action_mask=list(MASK),
        weight=0.1,
        meta={"rollout_id": "r0", "step_index": 0},
        attachments=SampleAttachments(actor_logps=ActorTokenLogps([-0.5, -0.25, -1.0, -2.0, -0.125])),
        token_weights=list(TOKEN_WEIGHTS),
    )
    return SAWItem(**{**fields, **changes})


def scalar_item(weight: float) -> SAWItem:
    actor = SampleAttachments(actor_logps=ActorTokenLogps([-1.0, -1.5]))
    return SAWItem([1, 2, 3], [1, 1, 1], [0, 1, 1], weight, {"rollout_id": "r1", "step_index": 0}, actor)


@pytest.mark.parametrize(
    ("bad", "message"),
    [([0.7, 0.7, -0.3], "token_weights has 3 entries, action_mask marks 5"), ([0.7, math.nan, 0, 0, 0], "finite")],
)
def test_token_weights_must_match_the_action_tokens_and_be_finite(bad, message):
    with pytest.raises(ValueError, match=message) as info:
        two_turn_item(token_weights=bad)
    assert "rollout_id='r0'" in str(info.value)


def test_collation_puts_each_weight_at_its_action_token_and_repeats_a_scalar_items_weight():
    batch = collate_saw_items([two_turn_item(), scalar_item(2.5)], pad_token_id=0, device="cpu")
    want = torch.tensor(
        [[0, 0, 0, 0.7, 0.7, 0, 0, -0.3, -0.3, -0.3], [0, 2.5, 2.5, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.float32
    )
    torch.testing.assert_close(batch["token_weight"], want, rtol=0, atol=0)
    assert "token_weight" not in collate_saw_items([scalar_item(2.5)], pad_token_id=0, device="cpu")


def test_packed_views_keep_each_weight_on_its_token():
    items = [two_turn_item(), scalar_item(2.5)]
    plan = PackPlan(items=items, rows=[[Segment((0,), 0, len(IDS)), Segment((1,), 0, 3)]])
    packed = pack_plan(plan, pad_token_id=0, device="cpu")
    view = packed.view  # each item from its last prompt token on
    for row, item in enumerate(items):
        mask = view["action_mask"][row].bool()
        weights = item.token_weights if item.token_weights is not None else [item.weight] * sum(item.action_mask)
        torch.testing.assert_close(view["token_weight"][row][mask], torch.tensor(weights, dtype=torch.float32))
        assert (view["token_weight"][row][~mask] == 0).all()
        flat = packed.input_ids.flatten()[packed.gather_index[row]][: int(view["attention_mask"][row].sum())]
        assert flat.tolist() == view["input_ids"][row][: len(flat)].tolist()  # the view reads its own tokens


def test_jsonl_msgpack_and_broadcast_encodings_keep_token_weights_exactly():
    item = two_turn_item()
    from_jsonl = saw_item_from_dict(saw_item_to_dict(item))
    entry = {k.encode(): v for k, v in encode_item(item, run_id="r", item_id="i").items()}
    from_stream = decode_entry(entry, run_id="r").item
    from_broadcast = item_from_json(item_to_json(item))
    for decoded in (from_jsonl, from_stream, from_broadcast):
        assert decoded.token_weights == TOKEN_WEIGHTS
        assert decoded.weight == 0.1
    plain = scalar_item(1.0)
    assert saw_item_from_dict(saw_item_to_dict(plain)).token_weights is None
    plain_entry = {k.encode(): v for k, v in encode_item(plain, run_id="r", item_id="i").items()}
    assert decode_entry(plain_entry, run_id="r").item.token_weights is None


@pytest.mark.parametrize(
    ("token_weights", "reason"), [([0.7, math.inf, 0.0, 0.0, 0.0], "invalid"), ([0.7, 0.7], "invalid")]
)
def test_a_stream_entry_with_bad_token_weights_is_refused(token_weights, reason):
    import msgpack

    entry = {k.encode(): v for k, v in encode_item(two_turn_item(), run_id="r", item_id="i").items()}
    body = msgpack.unpackb(entry[b"item"], raw=False)
    body[10] = torch.tensor(token_weights, dtype=torch.float64).numpy().astype("<f8").tobytes()  # token_weights
    entry[b"item"] = msgpack.packb(body, use_bin_type=True)
    with pytest.raises(BadEntry) as info:
        decode_entry(entry, run_id="r")
    assert info.value.reason == reason


def test_center_weights_counts_each_action_span_once_as_per_call_items_would():
    assert credit_units(two_turn_item()) == pytest.approx([0.7, -0.3])
    seq = SAWBatch(items=[two_turn_item(), scalar_item(2.0)])
    center_weights()(seq)
    # the same credit as three per-call items: 0.7, -0.3, 2.0 (mean 0.8)
    per_call = SAWBatch(items=[scalar_item(0.7), scalar_item(-0.3), scalar_item(2.0)])
    center_weights()(per_call)
    a, b, c = (it.weight for it in per_call.items)
    assert seq.items[0].token_weights == pytest.approx([a, a, b, b, b])
    assert seq.items[1].weight == pytest.approx(c)
    assert seq.items[0].weight == pytest.approx(0.1 - 0.8)  # the summary moves with them


def test_drop_zero_weight_keeps_an_item_while_any_token_has_credit():
    mixed = two_turn_item(weight=0.0, token_weights=[1.0, 1.0, -1.0, -1.0, -1.0])
    zero = two_turn_item(weight=0.0, token_weights=[0.0] * 5)
    batch = drop_zero_weight(SAWBatch(items=[mixed, zero, scalar_item(0.0), scalar_item(1.0)]))
    assert [it.token_weights for it in batch.items] == [[1.0, 1.0, -1.0, -1.0, -1.0], None]


def multi_turn_items(seed: int = 0) -> list[SAWItem]:
    """Episodes as one sequence (prompt, then reply/observation turns), each reply with its own weight."""
    rng = random.Random(seed)
    items = []
    for k in range(6):
        ids, mask, weights = [rng.randrange(2, 64) for _ in range(4 + k)], [0] * (4 + k), []
        for _ in range(rng.randrange(2, 4)):
            reply, obs, w = rng.randrange(1, 6), rng.randrange(1, 4), rng.uniform(-1, 1)
            ids += [rng.randrange(2, 64) for _ in range(reply + obs)]
            mask += [1] * reply + [0] * obs
            weights += [w] * reply
        actor = SampleAttachments(actor_logps=ActorTokenLogps([rng.uniform(-4, -0.5) for _ in weights]))
        items.append(SAWItem(ids, [1] * len(ids), mask, 0.0, {"rollout_id": f"r{k}"}, actor, weights))
    return [*items, scalar_item(0.5), scalar_item(-1.5)]


def sdpa_model() -> torch.nn.Module:
    """A 2-layer Qwen2 (vocab 64, SDPA attention) seeded 0: both arms of a comparison start from it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation="sdpa",
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


def test_the_trainers_packed_and_padded_forwards_give_the_same_per_token_weighted_loss_and_gradient():
    from ludic.training.layout.forward import micro_batch_loss, plan_micro_batches
    from ludic.training.loss import TokenClippedSurrogateLoss

    items = multi_turn_items()
    results = []
    for pack in (False, True):
        model = sdpa_model()
        mbs = plan_micro_batches(model, items, micro_token_budget=64, max_seq_len=32, pack=pack)
        assert all((mb.plan is not None) == pack for mb in mbs)
        total = torch.zeros(())
        for mb in mbs:
            loss, _, _ = micro_batch_loss(model, TokenClippedSurrogateLoss(), mb, pad_token_id=0, device="cpu")
            (loss * len(mb.items) / len(items)).backward()
            total = total + loss.detach() * len(mb.items) / len(items)
        results.append((total, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (plain_loss, plain_grads), (packed_loss, packed_grads) = results
    assert plain_loss.abs() > 0
    torch.testing.assert_close(packed_loss, plain_loss, atol=1e-6, rtol=1e-5)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


class _Fixed:
    def __init__(self, items: list[SAWItem]) -> None:
        self.items = items

    async def next_batch(self) -> SAWBatch:
        return SAWBatch(items=[replace(it) for it in self.items], meta={"target_rollouts": 1})


def test_the_trainer_trains_one_sequence_as_the_sum_of_its_per_turn_items():
    """One Trainer step (SGD, no clipping) on the two-turn item vs on its two per-turn items: the loss
    is a mean over items, so the one item's update is exactly twice theirs (the sum, not the mean)."""
    from ludic.training.algorithm import RLAlgorithm
    from ludic.training.config import TrainerConfig
    from ludic.training.credit.assigners import ConstantCredit
    from ludic.training.loss import ReinforceLoss
    from ludic.training.trainer import Trainer

    first = SAWItem(IDS[:5], [1] * 5, MASK[:5], 0.7, {"rollout_id": "r0", "step_index": 0})
    second = SAWItem(IDS, [1] * len(IDS), [0] * 5 + MASK[5:], -0.3, {"rollout_id": "r0", "step_index": 1})
    one = two_turn_item(attachments=SampleAttachments())
    updates = []
    for items in ([one], [first, second]):
        model = sdpa_model()
        before = {k: v.detach().clone() for k, v in model.named_parameters()}
        trainer = Trainer(
            model=model,
            algo=RLAlgorithm("per_turn", ConstantCredit(), ReinforceLoss(old_logp_key=None)),
            batch_source=_Fixed(items),
            cfg=TrainerConfig(max_seq_len=32, micro_token_budget=64, max_grad_norm=None),
            optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
        )
        trainer.train_step_sync()
        updates.append({k: before[k] - v.detach() for k, v in model.named_parameters()})
    one_update, split_update = updates
    assert sum(u.abs().sum() for u in one_update.values()) > 0
    for name, delta in one_update.items():
        torch.testing.assert_close(delta, 2 * split_update[name], atol=1e-6, rtol=1e-4, msg=name)
