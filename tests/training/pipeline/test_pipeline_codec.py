"""Stream entries round-trip SAW items without pickle; every kind of bad entry is refused with its reason."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import numpy as np
import pytest

from ludic.training.batching.pipeline_codec import (
    SCHEMA_VERSION,
    BadEntry,
    _ones,
    decode_entry,
    decode_fields,
    encode_item,
)
from ludic.training.types import SAWItem


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
        (lambda f: f.update({b"v": b"1"}), "unknown_schema"),
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


def test_fields_as_xread_gives_them_decode_as_the_entry_does_in_any_order(make_item):
    entry = _fields(encode_item(make_item(3, version=2), run_id="r1", item_id="abc"))
    flat = [part for field in entry.items() for part in field]
    want = decode_entry(entry, run_id="r1")
    for fields in (flat, flat[2:] + flat[:2], [*flat, b"extra", b"1"]):
        item_id, version, item = decode_fields(fields, b"r1")
        assert (item_id, version, item) == (want.item_id, want.policy_version, want.item)
    with pytest.raises(BadEntry, match="no 'v' field") as info:
        decode_fields(flat[2:], b"r1")
    assert info.value.reason == "malformed"
    with pytest.raises(BadEntry) as info:
        decode_fields(flat, b"r2")
    assert info.value.reason == "foreign"


def _body(make_item) -> dict:
    return msgpack.unpackb(encode_item(make_item(0), run_id="r1", item_id="x")["data"], raw=False)


def _entry(body: dict) -> dict[bytes, bytes]:
    return {
        b"v": str(SCHEMA_VERSION).encode(),
        b"run": b"r1",
        b"data": msgpack.packb(body, use_bin_type=True),
    }


def _refused(body: dict) -> BadEntry:
    with pytest.raises(BadEntry) as info:
        decode_entry(_entry(body), run_id="r1")
    return info.value


def test_arrays_travel_packed_with_dtype_and_length(make_item):
    tokens = _body(make_item)["tokens"]
    assert tokens["input_ids"] == ["<i4", 5, np.array([0, 1, 2, 7, 8], "<i4").tobytes()]
    assert tokens["action_mask"] == ["|u1", 5, bytes([0, 0, 0, 1, 1])]
    assert tokens["actor_logps"] == ["<f4", 2, np.array([-0.5, -0.25], "<f4").tobytes()]


@pytest.mark.parametrize(
    ("name", "bad", "match"),
    [
        ("input_ids", lambda t: ["<i8", t[1], t[2] * 2], "input_ids has dtype '<i8', expected '<i4'"),
        ("input_ids", lambda t: [t[0], 6, t[2]], "input_ids: 20 bytes for 6 entries of <i4"),
        ("input_ids", lambda t: [t[0], t[1], t[2][:-1]], "input_ids: 19 bytes for 5 entries"),
        ("actor_logps", lambda t: ["<f8", 2, np.array([-0.5, -0.25]).tobytes()], "expected '<f4'"),
        ("attention_mask", lambda t: t[2], "expected \\[dtype, length, bytes\\]"),
        ("action_mask", lambda t: [t[0], "5", t[2]], "entries of"),
    ],
)
def test_a_wrong_dtype_or_byte_count_is_malformed(make_item, name, bad, match):
    body = _body(make_item)
    body["tokens"][name] = bad(body["tokens"][name])
    refused = _refused(body)
    assert refused.reason == "malformed"
    assert refused.args[0] == str(refused) and __import__("re").search(match, str(refused)), str(refused)


def test_unknown_arrays_and_missing_ones_are_malformed(make_item):
    body = _body(make_item)
    body["tokens"]["secret"] = ["<f4", 0, b""]
    assert _refused(body).reason == "malformed"
    body = _body(make_item)
    del body["tokens"]["attention_mask"]
    assert _refused(body).reason == "malformed"


def test_inconsistent_lengths_masks_and_floats_are_invalid(make_item):
    cases = {
        "action_mask": ["|u1", 3, bytes([0, 0, 1])],
        "attention_mask": ["|u1", 5, bytes([1, 1, 1, 2, 1])],
        "actor_logps": ["<f4", 2, np.array([-0.5, np.nan], "<f4").tobytes()],
    }
    for name, value in cases.items():
        body = _body(make_item)
        body["tokens"][name] = value
        assert _refused(body).reason == "invalid", name
    body = _body(make_item)
    body["tokens"]["actor_logps"] = ["<f4", 3, np.zeros(3, "<f4").tobytes()]
    assert "actor_logps has 3 entries, action_mask marks 2" in str(_refused(body))
    body = _body(make_item)
    body["tokens"]["input_ids"] = ["<i4", 0, b""]
    assert _refused(body).reason == "invalid"
    body = _body(make_item)
    body["weight"] = float("inf")
    assert _refused(body).reason == "invalid"


@pytest.mark.parametrize(
    "mask",
    [[1, 1, 1], [0, 0, 1], [0, 1, 0, 1], [1, 1, 0], [0, 0, 0], [], [1] * 70_000, [0] * 70_000 + [1] * 3],
)
def test_ones_counts_the_ones_of_any_mask_of_0s_and_1s(mask):
    assert _ones(bytes(mask)) == sum(mask)


@pytest.mark.parametrize(
    "mask", [[0, 2, 1], [0, 1, 2], [2], [1, 1, 255], [1, 0, 7], [0] * 70_000 + [1, 3], [1] * 70_000 + [2]]
)
def test_ones_refuses_a_mask_holding_anything_but_0s_and_1s(mask):
    assert _ones(bytes(mask)) == -1


def test_masks_of_any_layout_round_trip_and_a_bad_byte_anywhere_is_invalid(make_item):
    item = make_item(0)  # 5 tokens, the last 2 actions
    item.action_mask, item.attention_mask = [0, 1, 0, 1, 0], [1, 1, 1, 1, 0]  # two turns; a padded end
    decoded = decode_entry(_fields(encode_item(item, run_id="r1", item_id="x")), run_id="r1").item
    assert decoded.action_mask == [0, 1, 0, 1, 0] and decoded.attention_mask == [1, 1, 1, 1, 0]
    assert decoded.num_action_tokens == 2
    for at in range(5):
        body = _body(make_item)
        action = bytearray(body["tokens"]["action_mask"][2])
        action[at] = 2
        body["tokens"]["action_mask"][2] = bytes(action)
        assert _refused(body).reason == "invalid", at


def test_schema_1_entries_are_refused_as_unknown_schema(make_item):
    body = _body(make_item)
    old = {k: v for k, v in body.items() if k != "tokens"} | {"input_ids": body["tokens"]["input_ids"][2]}
    fields = {b"v": b"1", b"run": b"r1", b"data": msgpack.packb(old, use_bin_type=True)}
    with pytest.raises(BadEntry, match="schema b'1', this trainer reads 2") as info:
        decode_entry(fields, run_id="r1")
    assert info.value.reason == "unknown_schema"


def test_decoded_item_is_a_saw_item_equal_to_the_original_with_lists_built_on_read(make_item):
    item = make_item(10, version=3, weight=-0.75)
    item.attachments.frozen_logps["ref_logps"] = [-1.0, -2.0]
    decoded = decode_entry(_fields(encode_item(item, run_id="r1", item_id="abc")), run_id="r1").item
    assert isinstance(decoded, SAWItem) and "_list_input_ids" not in decoded.__dict__
    assert decoded == item and item == decoded
    assert decoded.attachments.frozen_logps == {"ref_logps": [-1.0, -2.0]}
    assert type(decoded.input_ids) is list and type(decoded.input_ids[0]) is int
    copy = replace(decoded, weight=2.0)  # built and checked like any SAWItem
    assert copy.input_ids == item.input_ids and copy.weight == 2.0
    with pytest.raises(ValueError, match="action_mask has 1 entries, input_ids 5"):
        replace(decoded, action_mask=[1])
    decoded.action_mask = [0, 0, 0, 0, 1]  # assignable like any dataclass field
    assert decoded.action_mask == [0, 0, 0, 0, 1] and decoded != item


def test_pickled_payload_is_never_executed(make_item):
    import pickle

    class Boom:
        def __reduce__(self):
            return (pytest.fail, ("unpickled!",))

    fields = {b"v": str(SCHEMA_VERSION).encode(), b"run": b"r1", b"data": pickle.dumps(Boom())}
    with pytest.raises(BadEntry):
        decode_entry(fields, run_id="r1")


def test_meta_that_msgpack_cannot_encode_names_the_key(make_item):
    item = make_item(0)
    item.meta["obj"] = object()
    with pytest.raises(TypeError, match=r"\['obj'\]"):
        encode_item(item, run_id="r1", item_id="x")


def test_values_that_do_not_fit_their_dtype_are_refused_when_encoding_naming_the_field(make_item):
    item = make_item(0)
    item.input_ids[0] = 2**31
    with pytest.raises(ValueError, match="SAWItem input_ids does not fit <i4"):
        encode_item(item, run_id="r1", item_id="x")
    item = make_item(0)
    item.attachments.actor_logps.token_logps[0] = 1e39
    with pytest.raises(ValueError, match="SAWItem actor_logps does not fit <f4"):
        encode_item(item, run_id="r1", item_id="x")


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, -np.nan])
@pytest.mark.parametrize("name", ["actor_logps", "token_weights"])
def test_any_nan_or_inf_among_the_floats_is_invalid_and_huge_finite_values_are_not(make_item, name, value):
    item = make_item(0)
    item.token_weights = [0.5, 0.25]
    body = msgpack.unpackb(encode_item(item, run_id="r1", item_id="x")["data"], raw=False)
    dtype = body["tokens"][name][0]
    for bad_at in (0, 1):
        values = np.array([-0.5, -0.25], dtype)
        values[bad_at] = value
        body["tokens"][name] = [dtype, 2, values.tobytes()]
        assert _refused(body).reason == "invalid"
    huge = np.array([np.finfo(dtype).max, -np.finfo(dtype).max], dtype)  # top byte 0x7F / 0xFF, but finite
    body["tokens"][name] = [dtype, 2, huge.tobytes()]
    decoded = decode_entry(_entry(body), run_id="r1").item
    got = decoded.attachments.actor_logps.token_logps if name == "actor_logps" else decoded.token_weights
    assert got == huge.tolist()


def test_a_decoded_item_reads_its_per_token_fields_packed_and_nothing_else(make_item):
    item = make_item(0)
    item.attachments.frozen_logps["ref_logps"] = [-1.0, -2.0]
    decoded = decode_entry(_fields(encode_item(item, run_id="r1", item_id="x")), run_id="r1").item
    ids = decoded.packed("input_ids")
    assert isinstance(ids, np.ndarray) and ids.dtype == np.dtype("<i4") and ids.tolist() == item.input_ids
    assert decoded.packed("token_weights") is None and decoded.token_weights is None  # sent without them
    for name in ("actor_logps", "frozen/ref_logps", "weight"):  # beside the fields on the wire; not per-token
        assert decoded.packed(name) is None
