"""Stream entries round-trip SAW items without pickle; every kind of bad entry is refused with its reason."""

from __future__ import annotations

import msgpack
import pytest

from ludic.training.batching.pipeline_codec import SCHEMA_VERSION, BadEntry, decode_entry, encode_item


def _fields(entry: dict[str, bytes]) -> dict[bytes, bytes]:
    return {k.encode(): v for k, v in entry.items()}


def test_item_round_trips_tokens_masks_logps_weight_meta_and_version(make_item):
    item = make_item(10, version=3, weight=-0.75)
    decoded = decode_entry(_fields(encode_item(item, run_id="r1", item_id="abc")), run_id="r1")
    assert decoded.item_id == "abc"
    assert decoded.policy_version == 3
    assert decoded.item.input_ids == [10, 11, 12, 7, 8]
    assert decoded.item.attention_mask == [1, 1, 1, 1, 1]
    assert decoded.item.action_mask == [0, 0, 0, 1, 1]
    assert decoded.item.attachments.actor_logps.token_logps == [-0.5, -0.25]
    assert decoded.item.weight == -0.75
    assert decoded.item.meta == {"policy_version": 3, "n": 10, "request_meta": {"group_id": "g2"}}


def test_entry_carries_schema_version_and_run(make_item):
    entry = encode_item(make_item(0), run_id="r1", item_id="x")
    assert entry["v"] == str(SCHEMA_VERSION).encode()
    assert entry["run"] == b"r1"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda f: f.pop(b"data"), "malformed"),
        (lambda f: f.update({b"v": b"99"}), "unknown_schema"),
        (lambda f: f.update({b"run": b"someone-else"}), "foreign"),
        (lambda f: f.update({b"data": f[b"data"][: len(f[b"data"]) // 2]}), "truncated"),
        (lambda f: f.update({b"data": b"\xc1garbage"}), "malformed"),
        (lambda f: f.update({b"data": msgpack.packb([1, 2, 3])}), "malformed"),
    ],
)
def test_bad_entries_raise_bad_entry_with_reason(mutate, reason, make_item):
    fields = _fields(encode_item(make_item(0), run_id="r1", item_id="x"))
    mutate(fields)
    with pytest.raises(BadEntry) as info:
        decode_entry(fields, run_id="r1")
    assert info.value.reason == reason


def _body_with(make_item, **changes):
    body = msgpack.unpackb(encode_item(make_item(0), run_id="r1", item_id="x")["data"], raw=False)
    body.update(changes)
    return {b"v": b"1", b"run": b"r1", b"data": msgpack.packb(body, use_bin_type=True)}


def test_inconsistent_lengths_are_invalid_not_a_crash(make_item):
    with pytest.raises(BadEntry) as info:
        decode_entry(_body_with(make_item, action_mask=bytes([0, 0, 1])), run_id="r1")
    assert info.value.reason == "invalid"
    assert "action_mask has 3 entries, input_ids 5" in str(info.value)


def test_odd_byte_count_is_truncated_and_non_binary_masks_invalid(make_item):
    with pytest.raises(BadEntry) as info:
        decode_entry(_body_with(make_item, input_ids=b"\x01\x00\x00"), run_id="r1")
    assert info.value.reason == "truncated"
    with pytest.raises(BadEntry) as info:
        decode_entry(_body_with(make_item, action_mask=bytes([0, 0, 0, 2, 1])), run_id="r1")
    assert info.value.reason == "invalid"


def test_pickled_payload_is_never_executed(make_item):
    import pickle

    class Boom:
        def __reduce__(self):
            return (pytest.fail, ("unpickled!",))

    fields = {b"v": b"1", b"run": b"r1", b"data": pickle.dumps(Boom())}
    with pytest.raises(BadEntry):
        decode_entry(fields, run_id="r1")


def test_meta_that_msgpack_cannot_encode_names_the_key(make_item):
    item = make_item(0)
    item.meta["obj"] = object()
    with pytest.raises(TypeError, match=r"\['obj'\]"):
        encode_item(item, run_id="r1", item_id="x")
