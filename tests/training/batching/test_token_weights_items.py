"""SAW items' per-token weights: validated, collated at their action positions, kept aligned by
packing, kept through every encoding, and honoured by the weight preprocessing steps."""

from __future__ import annotations

import math

import pytest
import torch

from ludic.training.algorithm import center_weights, credit_units, drop_zero_weight
from ludic.training.batching.jsonl import saw_item_from_dict, saw_item_to_dict
from ludic.training.batching.micro_batching import collate_saw_items
from ludic.training.batching.packing import PackPlan, Segment, pack_plan
from ludic.training.batching.pipeline_codec import BadEntry, decode_entry, encode_item
from ludic.training.distributed_batch import item_from_json, item_to_json
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
    body = msgpack.unpackb(entry[b"data"], raw=False)
    raw = torch.tensor(token_weights, dtype=torch.float64).numpy().astype("<f8").tobytes()
    body["tokens"]["token_weights"] = ["<f8", len(token_weights), raw]
    entry[b"data"] = msgpack.packb(body, use_bin_type=True)
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
