"""Property-based tests of what a publish sends: the walk and grouping of its tensors (``weight_buckets``), a peft
adapter as a payload (``lora_payload.adapter_payload``), and the bytes a trainer packs into the server's shared
buffer (``PeerBuffers.view``) as the server reads them back (``packing.unpack``).

Invariants: every tensor travels exactly once, in order, in buckets of at most ``bucket_bytes`` (a larger one
alone); a name that would reach the server twice (or is not a name) is refused naming it; an adapter payload
is exactly the peft layers' lora_A ``[r, in]`` / lora_B ``[out, r]`` (bit for bit, no copy) with the config that
rebuilds it, or a ValueError naming the layer the format cannot express; and bytes written through a mapped
buffer come back bit-exactly for any names, shapes and dtypes the wire format allows.
"""

from __future__ import annotations

import itertools
import json
import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ludic.distributed.lora_payload import adapter_payload
from ludic.distributed.shared_buffers import PeerBuffers
from ludic.distributed.weight_buckets import buckets, named_tensors
from ludic.inference.weight_sync.adapter_config import AdapterConfig, lora_names
from ludic.inference.weight_sync.packing import DTYPES, TensorMeta, pack, packed_size, unpack
from ludic.inference.weight_sync.shared_memory import allocate_shared

peft = pytest.importorskip("peft")
FAST = settings()  # the suite's profile (tests/conftest.py): 200 examples, 500 under CI=true
SHAPES = st.lists(st.integers(0, 5), max_size=3)
NAMES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)


def raw_tensor(dtype_name: str, shape: list[int], seed: int) -> torch.Tensor:
    """A tensor of arbitrary bytes (NaN and inf patterns included), for a bit-exact comparison."""
    dtype = DTYPES[dtype_name]
    numel = math.prod(shape)
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        data &= 1  # a bool is stored as 0 or 1
    return data.view(dtype).reshape(shape)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                      b.reshape(-1).view(torch.uint8))  # fmt: skip


@FAST
@given(sizes=st.lists(st.integers(0, 40), max_size=12), bucket_bytes=st.integers(1, 120))
def test_buckets_send_every_tensor_once_in_order_within_the_bucket_size(sizes, bucket_bytes):
    pairs = [(f"t{i}", torch.zeros(n, dtype=torch.int16)) for i, n in enumerate(sizes)]  # 2 bytes an element
    groups = list(buckets(named_tensors(pairs), bucket_bytes))
    assert [name for g in groups for name, _ in g] == [name for name, _ in pairs]
    assert all(t is dict(pairs)[n] for g in groups for n, t in g)  # the tensors themselves, never copies
    nbytes = [sum(2 * t.numel() for _, t in g) for g in groups]
    assert all(g and (size <= bucket_bytes or len(g) == 1) for g, size in zip(groups, nbytes))
    # each bucket is full: the next one's first tensor did not fit into it
    assert all(size + 2 * groups[i + 1][0][1].numel() > bucket_bytes for i, size in enumerate(nbytes[:-1]))


@FAST
@given(names=st.lists(st.one_of(NAMES, st.just(""), st.integers(), st.none()), min_size=1, max_size=6))
def test_a_name_the_server_would_get_twice_or_that_is_no_name_is_refused_naming_it(names):
    """vLLM's server loads each call as it comes: a name sent twice was loaded twice, the last one winning, and a
    number as name reached it as one."""
    pairs = [(n, torch.ones(1)) for n in names]
    bad = [i for i, n in enumerate(names) if not isinstance(n, str) or not n or n in names[:i]]
    first_bad = bad[0] if bad else None
    walked = []
    if first_bad is None:
        walked.extend(named_tensors(pairs))
        assert [n for n, _ in walked] == names
        return
    with pytest.raises((TypeError, ValueError), match=r"^publish: ") as caught:
        walked.extend(named_tensors(pairs))
    assert repr(names[first_bad]) in str(caught.value)
    assert len(walked) == first_bad  # the ones before it were yielded; nothing after it


def test_a_value_that_is_not_a_tensor_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"'w' is a list, expected a torch.Tensor"):
        list(named_tensors({"w": [1.0]}))


class Layers(nn.Module):
    """Linear layers of drawn sizes (a chain), and one conv layer of each kind peft can adapt."""

    def __init__(self, widths: list[int]) -> None:
        super().__init__()
        pairs = itertools.pairwise(widths)
        self.lin = nn.ModuleList(nn.Linear(a, b, bias=i % 2 == 0) for i, (a, b) in enumerate(pairs))
        self.conv1 = nn.Conv1d(3, 4, 1)
        self.conv2 = nn.Conv2d(3, 4, 3)


@st.composite
def lora_models(draw: st.DrawFn) -> tuple[nn.Module, list[str], int, float, bool]:
    widths = draw(st.lists(st.integers(1, 9), min_size=2, max_size=5))
    linear = [f"lin.{i}" for i in range(len(widths) - 1)]
    targets = draw(st.lists(st.sampled_from([*linear, "conv1", "conv2"]), min_size=1, unique=True))
    rank, alpha, rslora = draw(st.integers(1, 6)), draw(st.floats(0.5, 64.0)), draw(st.booleans())
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, use_rslora=rslora,
                             init_lora_weights=False)  # fmt: skip
    torch.manual_seed(draw(st.integers(0, 2**16)))
    return peft.get_peft_model(Layers(widths), config), targets, rank, alpha, rslora


@settings(max_examples=60, deadline=None)
@given(case=lora_models())
def test_an_adapter_payload_is_the_layers_lora_weights_or_names_the_layer_it_cannot_carry(case):
    model, targets, rank, alpha, rslora = case
    base = model.get_base_model()
    convs = sorted(t for t in targets if t.startswith("conv"))
    if convs:  # its lora_A is [r, in, k...]: no ``W + s * B @ A`` of the format; a merged publish carries it
        with pytest.raises(ValueError, match=rf"^({'|'.join(convs)}): .*linear.*lora='merged'"):
            adapter_payload(model)
        return
    payload = adapter_payload(model)
    config = payload.config
    assert sorted(config.target_modules) == sorted(targets) and set(payload) == set(config.tensor_names())
    assert config.rank == rank and config.alpha == float(alpha)
    scaling = alpha / math.sqrt(rank) if rslora else alpha / rank
    assert config.scalings == pytest.approx([scaling] * len(targets), rel=1e-12)
    for module in config.target_modules:
        layer = base.get_submodule(module)
        a_name, b_name = lora_names(module)
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        assert payload[a_name].shape == (rank, layer.in_features)
        assert payload[b_name].shape == (layer.out_features, rank)
        assert same_bits(payload[a_name], a) and payload[a_name].data_ptr() == a.data_ptr()  # a view, no copy
        assert same_bits(payload[b_name], b) and payload[b_name].data_ptr() == b.data_ptr()
        assert not payload[a_name].requires_grad
    assert AdapterConfig.from_json(json.loads(json.dumps(config.to_json()))) == config


@pytest.fixture(scope="module")
def served_buffer():
    """One genuine shared receive buffer of this process, as Ludic's server reserves it."""
    buffer = allocate_shared(1 << 15, buffer_id=7)
    yield buffer
    buffer.close()


@st.composite
def calls(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    dtypes = [draw(st.sampled_from(sorted(DTYPES))) for _ in names]
    return {n: raw_tensor(d, draw(SHAPES), draw(st.integers(0, 2**31))) for n, d in zip(names, dtypes)}


@FAST
@given(tensors=calls())
def test_tensors_packed_into_the_servers_buffer_are_read_back_bit_exactly(served_buffer, tensors):
    metas = [TensorMeta.of(n, t) for n, t in tensors.items()]
    reservation = {"pid": os.getpid(), "buffer": served_buffer.buffer_id, "fd": served_buffer.fd,
                   "file_bytes": served_buffer.nbytes}  # fmt: skip
    view = PeerBuffers().view(reservation, packed_size(metas))
    pack(list(tensors.values()), out=view)
    # the server copies the bytes out of the shared buffer, then reads its copy
    private = served_buffer.tensor[: packed_size(metas)].clone()
    received = unpack(private, metas)
    assert list(received) == list(tensors)
    assert all(same_bits(received[n], t) for n, t in tensors.items())
