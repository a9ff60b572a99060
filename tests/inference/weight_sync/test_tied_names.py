"""A tied tensor goes into a weight blob once; its other names come back on the receiving side."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load, save

from ludic.inference.weight_sync.adapter_config import blob_metadata
from ludic.inference.weight_sync.tied_names import aliases_metadata, read_aliases, sendable_once, with_aliases
from ludic.inference.weight_sync.weights import assign_weights


def tied_state() -> dict[str, torch.Tensor]:
    embedding = torch.randn(10, 4)
    fused = torch.randn(6, 4)
    return {
        "embed.weight": embedding,
        "head.weight": embedding,  # the very same tensor: sent once
        "q.weight": fused[:3],  # two views of one storage, not the same tensor: each sent
        "k.weight": fused[3:],
        "norm.weight": torch.ones(4),
    }


def test_the_same_tensor_is_sent_once_and_named_in_the_metadata() -> None:
    state = tied_state()
    tensors, aliases = sendable_once(state)
    assert sorted(tensors) == ["embed.weight", "k.weight", "norm.weight", "q.weight"]
    assert aliases == {"head.weight": "embed.weight"}
    blob = save(tensors, metadata=aliases_metadata(aliases))  # safetensors takes it: no shared storage left
    received = with_aliases(load(blob), read_aliases(blob_metadata(blob)))
    assert sorted(received) == sorted(state)
    for name, tensor in state.items():
        assert torch.equal(received[name], tensor), name


def test_an_untied_receiver_gets_the_tensor_under_both_names() -> None:
    """The receiving model need not share the tie: each name's parameter is set."""
    embed, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    model = torch.nn.ModuleDict({"embed": embed, "head": head})
    state = tied_state()
    tensors, aliases = sendable_once({k: state[k] for k in ("embed.weight", "head.weight")})
    with torch.no_grad():  # as the engines apply an update
        assign_weights(model, with_aliases(tensors, aliases))
    assert torch.equal(embed.weight, state["embed.weight"]) and torch.equal(
        head.weight, state["embed.weight"]
    )
    assert embed.weight.data_ptr() != head.weight.data_ptr()  # still two parameters


def test_untied_weights_carry_no_alias_metadata() -> None:
    tensors, aliases = sendable_once({"a": torch.zeros(3), "b": torch.zeros(3)})  # equal values, two tensors
    assert aliases == {} and aliases_metadata(aliases) == {} and sorted(tensors) == ["a", "b"]
    assert read_aliases(None) == {} and read_aliases({}) == {}


@pytest.mark.parametrize(
    "metadata, message",
    [({"ludic.aliases": "{"}, "not JSON"),
     ({"ludic.aliases": "[1]"}, "names to names"),
     ({"ludic.aliases": '{"a": 3}'}, "names to names")],
)  # fmt: skip
def test_malformed_alias_metadata_is_named(metadata: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_aliases(metadata)


def test_an_alias_to_nothing_or_over_a_sent_tensor_is_refused() -> None:
    params = {"a": torch.zeros(2)}
    with pytest.raises(ValueError, match="'b' points at 'missing'"):
        with_aliases(params, {"b": "missing"})
    with pytest.raises(ValueError, match="'a' is also sent"):
        with_aliases(params, {"a": "a"})
