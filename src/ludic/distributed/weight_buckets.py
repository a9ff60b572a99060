"""A publish's weights, walked lazily and grouped into buckets (the unit of one ``/update_weights`` call)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from torch import Tensor

from ludic.inference.weight_sync.tied_names import view_key

WeightSource = Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]


def named_tensors(source: WeightSource) -> Iterator[tuple[str, Tensor]]:
    """``source``'s pairs, each checked as it is walked: a tensor under a non-empty name not seen before (a
    server that loads each call as it comes, vLLM's, loaded a repeated name twice, the last one winning)."""
    pairs = source.items() if isinstance(source, Mapping) else source
    seen: set[str] = set()
    for name, tensor in pairs:
        if not isinstance(name, str):
            raise TypeError(f"publish: {name!r:.100} is a {type(name).__name__}, expected a str name")
        if not name or name in seen:
            raise ValueError(f"publish: {name!r:.100} " + ("is sent twice" if name else "is no name"))
        if not isinstance(tensor, Tensor):
            raise TypeError(f"publish: {name!r} is a {type(tensor).__name__}, expected a torch.Tensor")
        seen.add(name)
        yield name, tensor


def each_tensor_once(pairs: Iterable[tuple[str, Tensor]], aliases: dict[str, str]) -> Iterator[tuple[str, Tensor]]:
    """``pairs`` without a name whose tensor is the very same as an earlier name's (a tied model's state dict
    names its embedding twice: SmolLM2's ``lm_head.weight``, 113 of its 538 MB); each dropped name goes into
    ``aliases`` as ``{name: the name sent}``, for the receiver to hand the one tensor to both. Each tensor
    sent is held until the walk ends: a freed one's memory could come back as a later tensor of the same
    shape, the same storage address to this check (so walk a state dict, whose tensors all live anyway)."""
    sent: dict[tuple, tuple[str, Tensor]] = {}
    for name, tensor in pairs:
        key = view_key(tensor)
        if tensor.numel() and tensor.device.type != "meta" and key in sent:
            aliases[name] = sent[key][0]
            continue
        sent[key] = (name, tensor)
        yield name, tensor


def buckets(pairs: Iterable[tuple[str, Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
    """Consecutive groups of tensors of at most ``bucket_bytes`` (a larger tensor travels alone)."""
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, tensor in pairs:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
