"""``each_tensor_once``: a publish sends a tied tensor once and names its other names as aliases."""

from __future__ import annotations

import torch

from ludic.distributed.weight_buckets import each_tensor_once


def test_the_very_same_tensor_goes_once_and_its_other_name_becomes_an_alias() -> None:
    embedding = torch.randn(8, 4)
    pairs = [("embed.weight", embedding), ("norm.weight", torch.ones(4)), ("lm_head.weight", embedding)]
    aliases: dict[str, str] = {}
    sent = [name for name, _ in each_tensor_once(pairs, aliases)]
    assert sent == ["embed.weight", "norm.weight"] and aliases == {"lm_head.weight": "embed.weight"}


def test_views_that_only_overlap_and_empty_or_meta_tensors_each_go_under_their_own_name() -> None:
    storage = torch.randn(16)
    empty = torch.empty(0)
    meta = torch.empty(3, device="meta")
    pairs = [("a", storage[:8]), ("b", storage[4:12]), ("c", storage[:8].view(2, 4)), ("e1", empty),
             ("e2", empty), ("m1", meta), ("m2", meta)]  # fmt: skip
    aliases: dict[str, str] = {}
    assert [name for name, _ in each_tensor_once(pairs, aliases)] == ["a", "b", "c", "e1", "e2", "m1", "m2"]
    assert aliases == {}


def test_a_tensor_freed_after_it_is_sent_cannot_make_a_later_one_look_tied() -> None:
    """Walked lazily (one layer gathered at a time), a freed tensor's memory comes back for the next one of its
    size at the same address; the walk holds what it sent, so no later tensor is taken for a tie."""

    def layers():
        for i in range(32):
            yield f"layer{i}.weight", torch.full((256,), float(i))  # dropped by the caller once sent

    aliases: dict[str, str] = {}
    values = [float(tensor[0]) for _, tensor in each_tensor_once(layers(), aliases)]
    assert values == [float(i) for i in range(32)] and aliases == {}
