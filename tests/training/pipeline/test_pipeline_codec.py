"""Stream entries round-trip SAW items without pickle; every kind of bad entry is refused with its reason."""

from __future__ import annotations

import re
from dataclasses import replace

import msgpack
import numpy as np
import pytest

from ludic.training.pipeline.codec import (
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


# the body's positions (schema 3)
SCHEMA, RUN, ID, VERSION, WEIGHT, META, IDS, ATTENTION, ACTION, ACTOR, TOKEN_WEIGHTS, FROZEN = range(12)


def test_entry_is_one_field_holding_schema_version_and_run_first(make_item):
    entry = encode_item(make_item(0), run_id="r1", item_id="x")
    assert list(entry) == ["item"]
    body = msgpack.unpackb(entry["item"], raw=False)
    assert body[:3] == [SCHEMA_VERSION, b"r1", "x"] and len(body) == 12


def _body(make_item, **changes) -> list:
    item = make_item(0)
    for name, value in changes.items():
        setattr(item, name, value)
    return msgpack.unpackb(encode_item(item, run_id="r1", item_id="x")["item"], raw=False)


def _entry(body: list) -> dict[bytes, bytes]:
    return {b"item": msgpack.packb(body, use_bin_type=True)}


def _refused(body: list | bytes, fields: dict[bytes, bytes] | None = None) -> BadEntry:
    with pytest.raises(BadEntry) as info:
        decode_entry(fields or (_entry(body) if isinstance(body, list) else {b"item": body}), run_id="r1")
    return info.value


def _changed(body: list, at: int, value) -> list:
    return [*body[:at], value, *body[at + 1 :]]


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda f: f.pop(b"item"), "malformed"),
        (lambda f: f.update({b"item": f.pop(b"item")[:-3]}), "truncated"),
        (lambda f: f.update({b"item": f[b"item"][: len(f[b"item"]) // 2]}), "truncated"),
        (lambda f: f.update({b"item": f[b"item"] + b"\x00"}), "malformed"),  # trailing bytes
        (lambda f: f.update({b"item": b"\xc1garbage"}), "malformed"),
        (lambda f: f.update({b"item": msgpack.packb({"id": "x"})}), "malformed"),
        (lambda f: f.update({b"item": msgpack.packb([])}), "malformed"),
        (lambda f: f.update({b"item": msgpack.packb([SCHEMA_VERSION])}), "malformed"),
        (lambda f: f.update({b"item": msgpack.packb([SCHEMA_VERSION, b"r1", "x"])}), "malformed"),
        (lambda f: f.update({b"item": msgpack.packb([99, b"r1"])}), "unknown_schema"),
        (lambda f: f.update({b"item": msgpack.packb(["3", b"r1"])}), "unknown_schema"),
        (lambda f: f.update({b"item": msgpack.packb([SCHEMA_VERSION, b"someone-else", 1])}), "foreign"),
        (lambda f: f.update({b"item": msgpack.packb([SCHEMA_VERSION, "r1", 1])}), "foreign"),  # run as str
        (lambda f: f.update({b"v": b"2", b"run": b"r1", b"data": f.pop(b"item")}), "unknown_schema"),
    ],
)
def test_bad_entries_raise_bad_entry_with_reason(mutate, reason, make_item):
    fields = _fields(encode_item(make_item(0), run_id="r1", item_id="x"))
    mutate(fields)
    with pytest.raises(BadEntry) as info:
        decode_entry(fields, run_id="r1")
    assert info.value.reason == reason


def test_another_runs_or_schemas_entry_is_told_apart_even_when_cut_or_of_another_shape(make_item):
    other = msgpack.packb(_changed(_body(make_item), RUN, b"someone-else"), use_bin_type=True)
    assert _refused(other[:-3]).reason == "foreign"
    assert "entry of run b'someone-else'" in str(_refused(other[:-3]))
    future = msgpack.packb([4, b"r1", {"a new": "layout"}], use_bin_type=True)
    assert _refused(future).reason == "unknown_schema" and _refused(future[:-2]).reason == "unknown_schema"
    assert _refused(msgpack.packb([*_body(make_item), 1], use_bin_type=True)).reason == "malformed"  # 13


def test_fields_as_xread_gives_them_decode_as_the_entry_does_whatever_else_is_there(make_item):
    entry = _fields(encode_item(make_item(3, version=2), run_id="r1", item_id="abc"))
    flat = [part for field in entry.items() for part in field]
    want = decode_entry(entry, run_id="r1")
    for fields in (flat, [b"extra", b"1", *flat], [*flat, b"extra", b"1"]):
        item_id, version, item = decode_fields(fields, b"r1")
        assert (item_id, version, item) == (want.item_id, want.policy_version, want.item)
    with pytest.raises(BadEntry, match="no 'item' field") as info:
        decode_fields([b"extra", b"1"], b"r1")
    assert info.value.reason == "malformed"
    with pytest.raises(BadEntry) as info:
        decode_fields(flat, b"r2")
    assert info.value.reason == "foreign"


def test_arrays_travel_as_bare_little_endian_bytes_at_fixed_positions(make_item):
    body = _body(make_item, token_weights=[0.5, 0.25])
    assert body[VERSION] == 0 and body[WEIGHT] == 1.0 and body[META]["n"] == 0
    assert body[IDS] == np.array([0, 1, 2, 7, 8], "<i4").tobytes()
    assert body[ATTENTION] == bytes([1, 1, 1, 1, 1]) and body[ACTION] == bytes([0, 0, 0, 1, 1])
    assert body[ACTOR] == np.array([-0.5, -0.25], "<f4").tobytes()
    assert body[TOKEN_WEIGHTS] == np.array([0.5, 0.25], "<f8").tobytes()
    assert body[FROZEN] == {}
    body = _body(make_item)
    assert body[TOKEN_WEIGHTS] is None


@pytest.mark.parametrize(
    ("at", "value", "match"),
    [
        (IDS, np.arange(5, dtype="<i4").tobytes()[:-1], "input_ids: 19 bytes, not a multiple of its entries' 4"),
        (IDS, [0, 1, 2, 7, 8], "input_ids is list, expected bin"),
        (IDS, "abcd", "input_ids is str"),
        (ATTENTION, [1, 1, 1, 1, 1], "attention_mask is list"),
        (ACTION, None, "action_mask is NoneType"),
        (ACTOR, np.array([-0.5, -0.25], "<f4").tobytes()[:-1], "actor_logps: 7 bytes, not a multiple"),
        (ACTOR, [-0.5, -0.25], "actor_logps is list"),
        (TOKEN_WEIGHTS, np.zeros(2, "<f4").tobytes()[:-2], "token_weights: 6 bytes, not a multiple of its entries' 8"),
        (FROZEN, {"ref": np.zeros(2, "<f4").tobytes()[:-1]}, "frozen_logps\\['ref'\\]: 7 bytes"),
        (FROZEN, {"ref": [0.0, 0.0]}, "frozen_logps\\['ref'\\] is list"),
        (FROZEN, {b"ref": np.zeros(2, "<f4").tobytes()}, "key b'ref' is not a str"),
        (FROZEN, None, "frozen log-probs NoneType"),
        (FROZEN, [], "frozen log-probs list"),
        (ID, 7, "id 7"),
        (VERSION, "3", "policy_version '3'"),
        (VERSION, True, "policy_version True"),
        (WEIGHT, 1, "weight 1 "),
        (META, None, "meta NoneType"),
    ],
)
def test_a_wrong_type_or_byte_count_is_malformed(make_item, at, value, match):
    refused = _refused(_changed(_body(make_item), at, value))
    assert refused.reason == "malformed"
    assert refused.args[0] == str(refused) and re.search(match, str(refused)), str(refused)


def test_inconsistent_lengths_masks_and_floats_are_invalid(make_item):
    cases = {
        ACTION: bytes([0, 0, 1]),
        ATTENTION: bytes([1, 1, 1, 2, 1]),
        ACTOR: np.array([-0.5, np.nan], "<f4").tobytes(),
        IDS: b"",
        WEIGHT: float("inf"),
        FROZEN: {"ref": np.array([-0.5, np.inf], "<f4").tobytes()},
    }
    for at, value in cases.items():
        assert _refused(_changed(_body(make_item), at, value)).reason == "invalid", at
    too_many = _refused(_changed(_body(make_item), ACTOR, np.zeros(3, "<f4").tobytes()))
    assert too_many.reason == "invalid" and "actor_logps has 3 entries, action_mask marks 2" in str(too_many)
    too_few = _refused(_changed(_body(make_item), FROZEN, {"ref": np.zeros(1, "<f4").tobytes()}))
    assert too_few.reason == "invalid" and "frozen_logps['ref'] has 1 entries" in str(too_few)
    short = _refused(_changed(_body(make_item), TOKEN_WEIGHTS, np.zeros(1, "<f8").tobytes()))
    assert short.reason == "invalid" and "token_weights has 1 entries" in str(short)


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
        action = bytearray(_body(make_item)[ACTION])
        action[at] = 2
        assert _refused(_changed(_body(make_item), ACTION, bytes(action))).reason == "invalid", at


def _schema_2_fields(make_item) -> dict[bytes, bytes]:
    """An entry as schema 2 wrote it: the version and the run in fields of their own, a map in ``data``."""
    raw = {"input_ids": (0, 1, 2, 7, 8), "attention_mask": (1,) * 5, "action_mask": (0, 0, 0, 1, 1)}
    tokens = {name: ["<i4" if name == "input_ids" else "|u1", 5, bytes(v) if name != "input_ids"
                     else np.array(v, "<i4").tobytes()] for name, v in raw.items()}  # fmt: skip
    body = {"id": "x", "policy_version": 0, "weight": 1.0, "meta": make_item(0).meta, "tokens": tokens}
    return {b"v": b"2", b"run": b"r1", b"data": msgpack.packb(body, use_bin_type=True)}


@pytest.mark.parametrize("schema", [b"1", b"2", b"3"])
def test_schema_1_and_2_entries_are_refused_as_unknown_schema(make_item, schema):
    fields = _schema_2_fields(make_item) | {b"v": schema}  # "3" in a v field: still the old layout
    with pytest.raises(BadEntry, match=f"schema b'{schema.decode()}', this trainer reads 3") as info:
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

    for fields in ({b"item": pickle.dumps(Boom())}, {b"v": b"2", b"run": b"r1", b"data": pickle.dumps(Boom())}):
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
@pytest.mark.parametrize("name", ["actor_logps", "token_weights", "ref"])
def test_any_nan_or_inf_among_the_floats_is_invalid_and_huge_finite_values_are_not(make_item, name, value):
    body = _body(make_item, token_weights=[0.5, 0.25])
    body[FROZEN] = {"ref": np.array([-1.0, -2.0], "<f4").tobytes()}
    at, dtype = {"actor_logps": (ACTOR, "<f4"), "token_weights": (TOKEN_WEIGHTS, "<f8"), "ref": (FROZEN, "<f4")}[name]  # fmt: skip
    for bad_at in (0, 1):
        values = np.array([-0.5, -0.25], dtype)
        values[bad_at] = value
        raw = values.tobytes()
        assert _refused(_changed(body, at, {"ref": raw} if at == FROZEN else raw)).reason == "invalid"
    top = np.finfo(dtype).max if name == "token_weights" else -np.finfo(dtype).max  # log-probs are <= 0
    huge = np.array([top, -np.finfo(dtype).max], dtype)  # top byte 0x7F / 0xFF, but finite
    raw = huge.tobytes()
    decoded = decode_entry(_entry(_changed(body, at, {"ref": raw} if at == FROZEN else raw)), run_id="r1").item
    got = {
        "actor_logps": lambda: decoded.attachments.actor_logps.token_logps,
        "token_weights": lambda: decoded.token_weights,
        "ref": lambda: decoded.attachments.frozen_logps["ref"],
    }[name]()
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


def test_a_cut_body_larger_than_msgpacks_default_buffer_still_tells_its_run():
    big = msgpack.packb([SCHEMA_VERSION, b"someone-else", "x", 0, 1.0, {}, b"\0" * (101 << 20)], use_bin_type=True)
    assert _refused(big[:-5]).reason == "foreign"
