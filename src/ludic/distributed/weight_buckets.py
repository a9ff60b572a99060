"""A publish's weights, walked lazily and grouped into buckets (the unit of one ``/update_weights`` call)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from torch import Tensor

WeightSource = Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]


def named_tensors(source: WeightSource) -> Iterator[tuple[str, Tensor]]:
    pairs = source.items() if isinstance(source, Mapping) else source
    for name, tensor in pairs:
        if not isinstance(tensor, Tensor):
            raise TypeError(f"publish: {name!r} is a {type(tensor).__name__}, expected a torch.Tensor")
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
