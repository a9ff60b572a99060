"""The whole-read fast paths give exactly what the step-by-step ones give: ``decode_read`` the result or refusal
of ``decode_fields`` for every entry, ``refusals`` the verdict of ``check_item`` for every item."""

from __future__ import annotations

import dataclasses
import struct

import msgpack
import numpy as np
import pytest

from ludic.training.pipeline import read_decoder
from ludic.training.pipeline.checks import EntryLimits, check_item, refusals
from ludic.training.pipeline.codec import BadEntry, decode_fields, encode_item
from ludic.training.pipeline.item import PackedSAWItem
from ludic.training.pipeline.read_decoder import decode_read

RUN = b"r1"
IDS, ATTENTION, ACTION, ACTOR, TOKEN_WEIGHTS, FROZEN = 6, 7, 8, 9, 10, 11  # positions in a schema-3 body


def _flat(item, item_id: str = "x") -> list[bytes]:
    return [b"item", encode_item(item, run_id=RUN.decode(), item_id=item_id)["item"]]


def _body(item) -> list:
    return msgpack.unpackb(_flat(item)[1], raw=False)


def _flat_body(body: list) -> list[bytes]:
    return [b"item", msgpack.packb(body, use_bin_type=True)]


def _reference(fields) -> object:
    try:
        return decode_fields(fields, RUN)
    except BadEntry as exc:
        return exc


def _same(got: object, want: object) -> bool:
    if isinstance(want, BadEntry):
        return type(got) is BadEntry and (got.reason, str(got)) == (want.reason, str(want))
    return got == want and type(got[2]) is PackedSAWItem


def _good_layouts(make_item) -> list:
    """Items the fast path takes (the usual ones) and some it leaves to decode_fields."""
    usual, weighted, no_logps, two_turns, padded, frozen, huge = (make_item(n) for n in range(7))
    weighted.token_weights = [0.5, -2.0]
    no_logps.attachments.actor_logps = None
    two_turns.action_mask = [0, 1, 0, 1, 0]
    padded.attention_mask = [1, 1, 1, 1, 0]
    frozen.attachments.frozen_logps["ref_logps"] = [-1.0, -2.0]
    # finite, but with a top byte of 0xFF: looked at closer
    huge.attachments.actor_logps.token_logps = [-3e38, -0.5]
    return [usual, weighted, no_logps, two_turns, padded, frozen, huge]


def test_decode_read_gives_decode_fields_items_for_every_layout(make_item):
    entries = [[b"%d-0" % i, _flat(item, f"id{i}")] for i, item in enumerate(_good_layouts(make_item))]
    entries.append([b"9-0", [b"extra", b"1", *_flat(make_item(9))]])  # another field beside
    got = decode_read(entries, RUN)
    assert len(got) == len(entries)
    assert all("_list_input_ids" not in r[2].__dict__ for r in got)  # still packed
    for (_, fields), result in zip(entries, got, strict=True):
        assert _same(result, _reference(fields))
    assert got[0][2].input_ids == [0, 1, 2, 7, 8] and got[1][2].token_weights == [0.5, -2.0]


def test_the_usual_items_never_leave_the_fast_path(make_item, monkeypatch):
    def refuse(*args):
        raise AssertionError("decode_fields was called")

    monkeypatch.setattr(read_decoder, "decode_fields", refuse)
    usual, weighted = make_item(0), make_item(1)
    weighted.token_weights = [1.0, 0.25]
    results = decode_read([[b"1-0", _flat(usual)], [b"2-0", _flat(weighted)]], RUN)
    assert [r[2] for r in results] == [usual, weighted]


def _broken_values() -> list:
    nan4, inf8 = struct.pack("<ff", -0.5, float("nan")), struct.pack("<dd", 1.0, float("inf"))
    return [None, 1, True, 1.5, float("nan"), float("inf"), "x", b"", b"\x00", b"\x02" * 5, b"\x01" * 5,
            bytes([0, 0, 0, 1, 2]), np.zeros(5, "<i4").tobytes(), np.zeros(2, "<f4").tobytes(), nan4, inf8,
            np.zeros(3, "<f4").tobytes(), np.zeros(2, "<f8").tobytes(), [], {}, {"ref": b"\x00" * 8}, {1: b""}]  # fmt: skip


def test_decode_read_refuses_every_broken_body_as_decode_fields_does(make_item):
    """Each of the body's 12 elements replaced by each of a range of wrong (and some right) values, and cut or
    otherwise broken bodies: the same result, reason and message, every time."""
    body = _body(make_item(0))
    entries = []
    for at in range(12):
        for value in _broken_values():
            entries.append([b"1-0", _flat_body([*body[:at], value, *body[at + 1 :]])])
    good = _flat(make_item(0))[1]
    for fields in ([b"item", good[:-3]], [b"item", good + b"\0"], [b"item", b"\xc1"], [b"item", 7], [b"v", b"2"],
                   [b"other", good], [b"item"], _flat_body(body[:11]), _flat_body([*body, 1]), [b"item", good, b"x", b"y"]):  # fmt: skip
        entries.append([b"1-0", fields])
    got = decode_read(entries, RUN)
    refused = 0
    for (_, fields), result in zip(entries, got, strict=True):
        want = _reference(fields)
        assert _same(result, want), (fields, result, want)
        refused += isinstance(want, BadEntry)
    assert refused > 200  # most are broken


def _items(make_item) -> list:
    def meta(n, **kw):
        item = make_item(n)
        item.meta.update(kw)
        return item

    return [
        make_item(0), meta(1, sampling_temperature=0.7, sampling_top_p=1.0), meta(2, sampling_temperature=0),
        meta(3, sampling_temperature=1), meta(4, sampling_temperature=0.0), meta(5, sampling_top_p=1),
        dataclasses.replace(make_item(6), token_weights=[1.0, -5.0]),
        dataclasses.replace(make_item(7), input_ids=[1, 2, 258, 7, 8]),
    ]  # fmt: skip


def _bad(make_item) -> list:
    def meta(n, **kw):
        item = make_item(n)
        item.meta.update(kw)
        return item

    return [
        dataclasses.replace(make_item(20), input_ids=[1, 2, 259, 7, 8]),
        dataclasses.replace(make_item(21), input_ids=[1, -1, 2, 7, 8]), make_item(22, weight=-2e6),
        dataclasses.replace(make_item(23), token_weights=[1.0, 1e7]), meta(24, sampling_temperature=float("nan")),
        meta(25, sampling_temperature=1e-5), meta(26, sampling_temperature=5e3), meta(27, sampling_top_p=0.95),
        meta(28, sampling_top_p=float("nan")), meta(29, sampling_temperature=-1.0),
        # not numbers: read as T = 1 by the trainer, so refused (issue 37)
        meta(30, sampling_temperature="0.7"), meta(31, sampling_temperature=True),
        meta(32, sampling_temperature=False), meta(33, sampling_top_p=True),
    ]  # fmt: skip


def _verdict(item, limits) -> BadEntry | None:
    try:
        check_item(item, limits)
    except BadEntry as exc:
        return exc
    return None


def _decoded(items) -> list:
    return [r[2] for r in decode_read([[b"1-0", _flat(it)] for it in items], RUN)]


@pytest.mark.parametrize("allow_nucleus", [False, True])
def test_refusals_of_a_read_are_check_items_verdicts(make_item, allow_nucleus):
    limits = EntryLimits(259, allow_nucleus=allow_nucleus)
    good, bad = _items(make_item), _bad(make_item)
    assert refusals(_decoded(good), limits) == [None] * len(good)
    for offender in bad:  # alone among good items, popped or built in memory: named, and nothing else is
        for items in (_decoded([*good, offender]), [*good, offender]):
            want = [_verdict(it, limits) for it in items]
            got = refusals(items, limits)
            assert [(type(v), str(v)) for v in got] == [(type(v), str(v)) for v in want]
    got = refusals(_decoded([*good, *bad]), limits)
    reasons = [v.reason for v in got if v is not None]
    assert reasons == [v.reason for v in (_verdict(it, limits) for it in [*good, *bad]) if v is not None]
    # where nucleus items are taken, so are top_p 0.95, NaN and True
    assert len(reasons) == len(bad) - 3 * allow_nucleus
