"""Stream entries that cannot lie (issue 37): impossible values are refused with a reason the batch source
counts, and a property test holds every decoded entry to the same invariant.

Invariant (``decode_fields`` and ``decode_read``, on any body): refused with ``BadEntry`` (a reason from the
codec's list), or accepted as an item that is well-formed (log-probs finite and <= 0, masks of 0s and 1s
with at least one 1, lengths agreeing, a version in [0, 2**63)) and that re-encodes to an entry decoding to
exactly the same item; never another exception. ``decode_read`` gives the same verdict as ``decode_fields``.
"""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ludic.training.pipeline.checks import EntryLimits, check_item
from ludic.training.pipeline.codec import (
    MAX_ID_CHARS,
    SCHEMA_VERSION,
    BadEntry,
    decode_entry,
    decode_fields,
    encode_item,
)
from ludic.training.pipeline.read_decoder import decode_read
from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWItem

RUN = b"r1"
REASONS = {"malformed", "truncated", "invalid", "unknown_schema", "foreign"}
SCHEMA, _, ID, VERSION, WEIGHT, META, IDS, ATTENTION, ACTION, ACTOR, TOKEN_WEIGHTS, FROZEN = range(12)


def _item(actor=(-0.5, -0.25), *, version: int | None = 3) -> SAWItem:
    return SAWItem(
        input_ids=[5, 6, 7, 8], attention_mask=[1, 1, 1, 1], action_mask=[0, 0, 1, 1], weight=1.0,
        meta={} if version is None else {"policy_version": version}, attachments=SampleAttachments(ActorTokenLogps(list(actor))),
    )  # fmt: skip


def _body(item: SAWItem | None = None, item_id: str = "x") -> list:
    return msgpack.unpackb(encode_item(item or _item(), run_id="r1", item_id=item_id)["item"], raw=False)


def _verdict(body: list) -> BadEntry | tuple:
    """decode_fields's verdict, after checking decode_read gives the same one."""
    fields = [b"item", msgpack.packb(body, use_bin_type=True)]
    try:
        want: BadEntry | tuple = decode_fields(fields, RUN)
    except BadEntry as exc:
        want = exc
    (got,) = decode_read([[b"1-0", fields]], RUN)
    if isinstance(want, BadEntry):
        assert isinstance(got, BadEntry) and (got.reason, str(got)) == (want.reason, str(want))
    else:
        assert got == want
    return want


def _changed(body: list, at: int, value) -> list:
    return [*body[:at], value, *body[at + 1 :]]


# ---- defect 4: positive sampling log-probs -----------------------------------------------------------


@pytest.mark.parametrize("logps", [[1.0, 5.0], [0.0, 1e-30], [-1.0, 0.5], [3.4e38, -1.0]])
def test_positive_actor_log_probs_are_refused_as_invalid(logps):
    refused = _verdict(_body(_item(logps)))
    assert isinstance(refused, BadEntry) and refused.reason == "invalid"
    assert "actor_logps holds" in str(refused) and "positive log-prob" in str(refused)


def test_positive_frozen_log_probs_are_refused_and_zero_or_negative_ones_taken():
    body = _body()
    positive = _verdict(_changed(body, FROZEN, {"ref": np.array([-1.0, 2.0], "<f4").tobytes()}))
    assert (
        isinstance(positive, BadEntry)
        and positive.reason == "invalid"
        and "frozen_logps['ref']" in str(positive)
    )
    for logps in ([0.0, 0.0], [-0.0, -1e-40], [-3.0, 0.0]):  # zero (probability 1) and negatives are fine
        _, _, item = _verdict(_body(_item(logps)))
        assert item.attachments.actor_logps.token_logps == np.array(logps, "<f4").tolist()


# ---- defect 8: versions, ids, masks ------------------------------------------------------------------


@pytest.mark.parametrize("version", [-1, -(2**63), 2**63, 2**64 - 1])
def test_policy_versions_outside_int64_and_negative_are_refused(version):
    refused = _verdict(_changed(_body(_item(version=None)), VERSION, version))
    assert isinstance(refused, BadEntry) and refused.reason == "invalid" and "policy_version" in str(refused)


def test_the_largest_version_and_a_long_id_within_the_bound_are_taken():
    body = _changed(_body(_item(version=None), item_id="a" * MAX_ID_CHARS), VERSION, 2**63 - 1)
    item_id, version, _ = _verdict(body)
    assert (item_id, version) == ("a" * MAX_ID_CHARS, 2**63 - 1)


@pytest.mark.parametrize("length", [MAX_ID_CHARS + 1, 1 << 20])
def test_huge_item_ids_are_refused(length):
    refused = _verdict(_body(item_id="i" * length))
    assert (
        isinstance(refused, BadEntry)
        and refused.reason == "invalid"
        and f"id of {length} chars" in str(refused)
    )


def test_a_meta_policy_version_other_than_the_entrys_is_refused():
    body = _body()  # version 3, meta {"policy_version": 3}
    for meta_version in (-1, 4, "3", 3.0, True):
        refused = _verdict(_changed(body, META, {"policy_version": meta_version}))
        assert (
            isinstance(refused, BadEntry)
            and refused.reason == "invalid"
            and "meta policy_version" in str(refused)
        )


@pytest.mark.parametrize("at", [ATTENTION, ACTION])
def test_all_zero_masks_are_refused(at):
    refused = _verdict(_changed(_body(), at, bytes(4)))
    assert isinstance(refused, BadEntry) and refused.reason == "invalid" and "is all zeros" in str(refused)


@pytest.mark.parametrize(
    ("meta", "reason"),
    [
        ({"sampling_temperature": "0.7"}, "bad_temperature"),
        ({"sampling_temperature": True}, "bad_temperature"),
        ({"sampling_temperature": False}, "bad_temperature"),
        ({"sampling_temperature": [0.7]}, "bad_temperature"),
        ({"sampling_top_p": "1.0"}, "nucleus_sampled"),
        ({"sampling_top_p": True}, "nucleus_sampled"),
    ],
)
def test_sampling_settings_that_are_not_numbers_are_refused(meta, reason):
    item = _item()
    item.meta.update(meta)
    with pytest.raises(BadEntry) as info:
        check_item(item, EntryLimits(259))
    assert info.value.reason == reason and "is not a number" in str(info.value)
    item.meta.update({k: 0.7 if "temperature" in k else 1.0 for k in meta})  # the number itself is fine
    check_item(item, EntryLimits(259))


# ---- the property ------------------------------------------------------------------------------------

_f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
_msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=24),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


@st.composite
def _bodies(draw) -> list:
    """A schema-3 body: well-formed, then with up to three elements replaced by anything msgpack holds, or
    per-token arrays of any bytes and any float values."""
    n_prompt, n_action = draw(st.integers(0, 4)), draw(st.integers(0, 4))
    n = n_prompt + n_action
    body = [
        SCHEMA_VERSION, RUN, draw(st.text(max_size=12)),
        draw(st.none() | st.integers(-5, 2**64 - 1)), draw(st.floats()), {"k": 1},
        np.array(draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n)), "<i4").tobytes(),
        bytes([1] * n), bytes([0] * n_prompt + [1] * n_action),
        draw(st.none() | st.just(np.array(draw(st.lists(_f32, min_size=n_action, max_size=n_action)), "<f4").tobytes())),
        draw(st.none() | st.just(np.array(draw(st.lists(st.floats(), min_size=n_action, max_size=n_action)), "<f8").tobytes())),
        draw(st.dictionaries(st.text(max_size=3), st.just(np.array(draw(st.lists(_f32, min_size=n_action, max_size=n_action)), "<f4").tobytes()), max_size=2)),
    ]  # fmt: skip
    for at in draw(st.lists(st.integers(2, 11), max_size=3)):
        body[at] = draw(_msgpack_values | st.binary(max_size=20))
    return body


def _well_formed(item_id: str, version: int | None, item: SAWItem) -> None:
    n = len(item.input_ids)
    assert n and len(item.attention_mask) == n and len(item.action_mask) == n
    assert set(item.attention_mask) <= {0, 1} and set(item.action_mask) <= {0, 1}
    assert 1 in item.attention_mask and 1 in item.action_mask
    assert len(item_id) <= MAX_ID_CHARS and (version is None or 0 <= version < 2**63)
    assert math.isfinite(item.weight)
    n_action = sum(item.action_mask)
    logps = [] if item.attachments.actor_logps is None else [item.attachments.actor_logps.token_logps]
    for values in [*logps, *item.attachments.frozen_logps.values()]:
        assert len(values) == n_action and all(math.isfinite(v) and v <= 0 for v in values)
    if item.token_weights is not None:
        assert len(item.token_weights) == n_action and all(math.isfinite(w) for w in item.token_weights)


@given(_bodies())
def test_any_body_is_refused_with_a_reason_or_decodes_to_a_well_formed_item_that_round_trips(body):
    verdict = _verdict(body)
    if isinstance(verdict, BadEntry):
        assert verdict.reason in REASONS
        return
    item_id, version, item = verdict
    _well_formed(item_id, version, item)
    again = decode_entry({b"item": msgpack.packb(_changed(_body(item, item_id), VERSION, version), use_bin_type=True)}, run_id="r1")  # fmt: skip
    assert (again.item_id, again.policy_version, again.item) == (item_id, version, item)


@given(st.binary(max_size=200))
def test_any_bytes_are_refused_with_a_reason_or_decode_to_a_well_formed_item(data):
    try:
        item_id, version, item = decode_fields([b"item", data], RUN)
    except BadEntry as exc:
        assert exc.reason in REASONS
        return
    _well_formed(item_id, version, item)


# ---- counted by the batch source, over a real Redis ---------------------------------------------------


async def test_impossible_entries_are_skipped_and_counted_by_reason(redis_server, run_id, make_item):
    from ludic.training.pipeline.batch_source import PipelineBatchSource
    from ludic.training.pipeline.stream import PipelineStream

    def entry(body: list) -> dict[str, bytes]:
        return {"item": msgpack.packb([body[0], run_id.encode(), *body[2:]], use_bin_type=True)}

    hot = make_item(5)
    hot.meta["sampling_temperature"] = "0.7"
    bad = [
        entry(_body(_item([1.0, 5.0]))),  # positive log-probs (the issue's [+1, +5])
        entry(_changed(_body(_item(version=None)), VERSION, -1)),
        entry(_changed(_body(_item(version=None)), VERSION, 2**64 - 1)),
        entry(_body(item_id="i" * (1 << 20))),
        entry(_changed(_body(), ATTENTION, bytes(4))),
        entry(_changed(_body(), ACTION, bytes(4))),
        encode_item(hot, run_id=run_id, item_id="hot"),
    ]
    stream = PipelineStream(redis_server.url, run_id)
    try:
        await stream.push([encode_item(make_item(0), run_id=run_id, item_id="good-0")])
        for fields in bad:
            await stream.push_raw(dict(fields))
        await stream.push([encode_item(make_item(1), run_id=run_id, item_id="good-1")])
    finally:
        await stream.close()
    source = PipelineBatchSource(redis_url=redis_server.url, run_id=run_id, block_ms=50, version_fn=lambda: 0, vocab_size=1000, batch_size=2)  # fmt: skip
    try:
        batch = await source.next_batch()
    finally:
        await source.close()
    assert [it.meta["pipeline_item_id"] for it in batch.items] == ["good-0", "good-1"]
    assert (
        source.counters["pipeline/skipped_invalid"] == 6
        and source.counters["pipeline/skipped_bad_temperature"] == 1
    )
    assert source.consumed == 9
