"""Property-based tests of what the trainer reads from the server before it writes any weight: ``GET
/weight_info`` (``server_weight_info``, then ``check_against_server``), ``GET /get_world_size`` (``join_group``)
and a shared-memory buffer reservation (``PeerBuffers.view``), each a well-formed reply with hostile changes
drawn by hypothesis (values of any JSON type, NaN/inf, bools for ints, negative or huge sizes, duplicated,
missing or extra entries, lists of other lengths).

Invariant: a malformed reply is refused with a ``ValueError`` (``RuntimeError`` for a reservation, as
documented) that names the reply and the field; nothing is joined, mapped or posted after it; a well-formed
one is read exactly as sent. Never another exception type.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.distributed._server_meta import check_against_server, server_weight_info
from ludic.distributed._transfer_join import MAX_WORLD_SIZE, join_group
from ludic.distributed.shared_buffers import PeerBuffers
from ludic.inference.weight_sync.packing import DTYPES, TensorMeta
from ludic.inference.weight_sync.shared_memory import allocate_shared

FAST = settings()  # the suite's profile (tests/conftest.py): 200 examples, 500 under CI=true
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=8),
)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                       max_size=3), max_leaves=6)  # fmt: skip
NAMES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
SHAPES = st.lists(st.integers(0, 6), max_size=3)


class Replying:
    """A server's control plane reduced to its replies: each GET answers ``replies[path]`` as decoded JSON (the
    client decodes any JSON, NaN and Infinity included); each POST is recorded and answered ``{}``."""

    def __init__(self, **replies: Any) -> None:
        self.replies = {f"/{k}": json.dumps(v) for k, v in replies.items()}
        self.posted: list[str] = []

    def get_json_sync(self, path: str, *, timeout_s: float) -> Any:
        return json.loads(self.replies[path])

    def post_json_sync(self, path: str, body: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        self.posted.append(path)
        return {}


def is_size(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def well_formed_info(info: Any) -> bool:
    """What ``/weight_info`` must be: three lists of one length, unique non-empty names, dtype names, shapes
    of non-negative ints."""
    if not isinstance(info, dict):
        return False
    names, dtypes, shapes = (info.get(k) for k in ("names", "dtype_names", "shapes"))
    if not all(isinstance(f, list) for f in (names, dtypes, shapes)):
        return False
    if not len(names) == len(dtypes) == len(shapes):
        return False
    return (all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names)
            and all(isinstance(d, str) and d for d in dtypes)
            and all(isinstance(s, list) and all(map(is_size, s)) for s in shapes))  # fmt: skip


@st.composite
def weight_infos(draw: st.DrawFn) -> dict[str, list]:
    """A well-formed ``/weight_info`` reply (Ludic's server's layout: ``weights.weight_info``)."""
    names = draw(st.lists(NAMES, min_size=1, max_size=5, unique=True))
    return {"names": names, "dtype_names": [draw(st.sampled_from(sorted(DTYPES))) for _ in names],
            "shapes": [draw(SHAPES) for _ in names]}  # fmt: skip


@st.composite
def hostile_infos(draw: st.DrawFn) -> Any:
    """A well-formed reply with one hostile change (or none)."""
    info = draw(weight_infos())
    key = draw(st.sampled_from(["names", "dtype_names", "shapes"]))
    changes = ["none", "whole", "drop", "item", "dim", "duplicate", "shorten", "lengthen"]
    change = draw(st.sampled_from(changes))
    i = draw(st.integers(0, len(info["names"]) - 1))
    if change == "whole":
        return draw(JSON) if draw(st.booleans()) else {**info, key: draw(JSON)}
    if change == "drop":
        del info[key]
    elif change == "item":
        info[key][i] = draw(JSON)
    elif change == "dim":
        info["shapes"][i] = [*info["shapes"][i], draw(JSON)]
    elif change == "duplicate":
        info["names"].append(info["names"][i])
        info["dtype_names"].append(info["dtype_names"][i])
        info["shapes"].append(draw(SHAPES))
    elif change == "shorten":
        info[key].pop(i)
    elif change == "lengthen":
        info[key].append(info[key][i])
    return info


@FAST
@given(info=hostile_infos())
def test_a_weight_info_reply_is_read_exactly_or_refused_naming_what_is_wrong(info):
    client = Replying(weight_info=info)
    if well_formed_info(info):
        expected = server_weight_info(client, timeout_s=1.0)
        rows = zip(info["names"], info["dtype_names"], info["shapes"])
        assert expected == {n: (d, tuple(s)) for n, d, s in rows}
        assert all(type(d) is int for _, shape in expected.values() for d in shape)
    else:
        with pytest.raises(ValueError, match=r"^the server's /weight_info .+"):
            server_weight_info(client, timeout_s=1.0)


@st.composite
def publishes(draw: st.DrawFn) -> tuple[dict[str, list], list[TensorMeta], int, str]:
    """A server's weight info, a publish of exactly its tensors, which tensor to change and how."""
    info = draw(weight_infos())
    rows = zip(info["names"], info["dtype_names"], info["shapes"])
    metas = [TensorMeta(n, d, tuple(s)) for n, d, s in rows]
    i = draw(st.integers(0, len(metas) - 1))
    return info, metas, i, draw(st.sampled_from(["none", "name", "shape", "kind", "same kind"]))


@FAST
@given(case=publishes(), other=NAMES, dim=st.integers(0, 6))
def test_a_tensor_the_server_has_no_place_for_is_named_before_any_byte_is_sent(case, other, dim):
    info, metas, i, change = case
    expected = server_weight_info(Replying(weight_info=info), timeout_s=1.0)
    m = metas[i]
    is_float = DTYPES[m.dtype_name].is_floating_point
    same_kind = [d for d in sorted(DTYPES) if DTYPES[d].is_floating_point == is_float]
    if change == "name" and other not in expected:
        metas[i], refused = TensorMeta(other, m.dtype_name, m.shape), f"has no parameter {other!r}"
    elif change == "shape":
        metas[i], refused = TensorMeta(m.name, m.dtype_name, (*m.shape, dim)), "has shape"
    elif change == "kind":  # a float tensor where the server holds ints, or the other way round
        kind = next(d for d in sorted(DTYPES) if DTYPES[d].is_floating_point != is_float)
        metas[i], refused = TensorMeta(m.name, kind, m.shape), "has dtype"
    else:  # another float width is cast by the server: accepted
        metas[i], refused = TensorMeta(m.name, same_kind[dim % len(same_kind)], m.shape), None
    if refused is None:
        check_against_server(metas, expected)
    else:
        with pytest.raises(ValueError, match=r"^publish: ") as caught:
            check_against_server(metas, expected)
        assert repr(metas[i].name) in str(caught.value) and refused in str(caught.value)


@FAST
@given(reply=st.one_of(JSON, st.builds(lambda v: {"world_size": v}, JSON)))
def test_a_world_size_that_is_not_a_count_of_ranks_is_refused_before_joining(reply):
    """A group of ``1 + world_size`` ranks is hosted for it: 0 or less made a group of the trainer alone (every
    broadcast then "succeeded" with nobody receiving), a float or bool was truncated, inf raised OverflowError."""
    size = reply.get("world_size") if isinstance(reply, dict) else None
    if is_size(size) and 1 <= size <= MAX_WORLD_SIZE:
        return  # a real count: joining it would wait for that many ranks (the publisher tests join real servers)
    client = Replying(get_world_size=reply)
    refused = pytest.raises(ValueError, match=r"^the server's /get_world_size reply .+world_size")
    with ThreadPoolExecutor(max_workers=1) as pool, refused:
        join_group(client, pool, "127.0.0.1", 1, "gloo", timeout_s=1.0, channels=1)
    assert client.posted == []  # the server was not told to join


@pytest.fixture(scope="module")
def served_buffer():
    """One genuine shared buffer of this process, as the server's reply names it."""
    buffer = allocate_shared(256, buffer_id=41)
    buffer.tensor.copy_(torch.arange(256, dtype=torch.int64).to(torch.uint8))
    yield buffer
    buffer.close()


FIELDS = ("pid", "buffer", "fd", "file_bytes")


@FAST
@given(field=st.sampled_from(FIELDS), value=JSON, drop=st.booleans(), whole=st.booleans(), nbytes=st.integers(0, 256))  # fmt: skip
def test_a_buffer_reservation_is_mapped_only_when_every_field_is_an_int(served_buffer, field, value, drop, whole, nbytes):  # fmt: skip
    genuine = {"pid": os.getpid(), "buffer": served_buffer.buffer_id, "fd": served_buffer.fd,
               "file_bytes": served_buffer.nbytes}  # fmt: skip
    reservation: Any = value if whole else {k: v for k, v in genuine.items() if not (drop and k == field)}
    if not whole and not drop:
        reservation[field] = value
    before = served_buffer.tensor.clone()
    peers = PeerBuffers()
    ints = isinstance(reservation, dict) and all(type(reservation.get(k)) is int for k in FIELDS)
    # the buffer id is a key only; pid, descriptor and size are what is mapped
    accepted = ints and all(reservation[k] == genuine[k] for k in ("pid", "fd", "file_bytes"))
    if accepted:
        view = peers.view(reservation, nbytes)
        assert view.numel() == nbytes and torch.equal(view, before[:nbytes])
    elif ints:
        with pytest.raises(RuntimeError):  # another process, descriptor or size: refused by the checks
            peers.view(reservation, nbytes)
    else:
        with pytest.raises(RuntimeError, match=r"^the server's buffer reservation is malformed.+"):
            peers.view(reservation, nbytes)
    assert len(peers) == int(accepted) and torch.equal(served_buffer.tensor, before)


def test_a_negative_call_size_is_refused_not_sliced_from_the_end(served_buffer):
    genuine = {"pid": os.getpid(), "buffer": served_buffer.buffer_id, "fd": served_buffer.fd,
               "file_bytes": served_buffer.nbytes}  # fmt: skip
    with pytest.raises(ValueError, match="-1 bytes"):
        PeerBuffers().view(genuine, -1)
