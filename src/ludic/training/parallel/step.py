"""What the Trainer asks of the data-parallel ranks; with one process every hook is the identity.

Under ``torchrun`` with an FSDP2-sharded model (``ludic.training.parallel.fsdp.shard_model``), every rank
holds the same global macro-batch (a deterministic batch source on every rank, or
``Rank0BatchSource``), and:

- :meth:`plan` gives each rank a token-balanced share of the items (largest first, to the rank with
  the fewest tokens), packs it into micro-batches, and pads every rank to the same number of
  micro-batches with zero-weight repeats (FSDP's collectives need every rank in every forward);
- each micro-batch's loss is scaled by ``len(mb) / N_global * world_size``; FSDP's reduce-scatter
  averages over ranks, so the gradient is ``sum_mb len(mb)/N_global * grad mean_mb(loss)``: the
  same as one process on the whole batch (every loss is a per-sequence mean);
- gradients are reduced only after the last micro-batch (``set_requires_gradient_sync``);
- the gradient norm, loss, stats and token counts are reduced so every rank reports the same numbers.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import resource
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from ludic.training.layout.micro_batching import truncate_item
from ludic.training.parallel.collective_timeout import named_collective
from ludic.training.parallel.collectives import all_gather_json, all_reduce_tensor, comm_device
from ludic.training.parallel.fsdp import is_fsdp_model
from ludic.training.stats import StatWeight, aggregate_stats, stat_weight
from ludic.training.types import SAWItem

MB = TypeVar("MB")


def balanced_share(items: Sequence[SAWItem], rank: int, world_size: int) -> list[SAWItem]:
    """This rank's items: longest first, each to the rank holding the fewest tokens (ties: lowest rank).

    Deterministic, so every rank computes the same partition without talking; input order is kept.
    """
    load = [0] * world_size
    owner = [0] * len(items)
    order = sorted(range(len(items)), key=lambda i: (-len(items[i].input_ids), i))
    for i in order:
        r = min(range(world_size), key=lambda k: (load[k], k))
        owner[i] = r
        load[r] += len(items[i].input_ids)
    return [it for i, it in enumerate(items) if owner[i] == rank]


def _memory_stats() -> dict[str, float]:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return {
            "gpu_mem_alloc_mb": torch.cuda.memory_allocated() / 2**20,
            "gpu_mem_peak_mb": torch.cuda.max_memory_allocated() / 2**20,
        }
    return {"cpu_rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_rss_mb": _rss_now_mb()}


def _rss_now_mb() -> float:
    """Resident memory right now (``/proc/self/statm``; the peak alone cannot show that memory stays flat)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):  # no procfs (not Linux)
        return float("nan")


class DataParallelGroup:
    """The ranks of the default process group training one FSDP2 model (or one process)."""

    def __init__(self, *, active: bool) -> None:
        self.active = active
        self.rank = dist.get_rank() if active else 0
        self.world_size = dist.get_world_size() if active else 1
        self._padding: list[Any] = []
        self._alloc_before = 0.0

    @classmethod
    def for_model(cls, model: nn.Module) -> DataParallelGroup:
        """Active when ``model`` is FSDP2-sharded and the process group has more than one rank."""
        on = is_fsdp_model(model) and dist.is_initialized() and dist.get_world_size() > 1
        return cls(active=on)

    @property
    def is_main(self) -> bool:
        """Only this rank logs and writes files."""
        return self.rank == 0

    @property
    def grad_scale(self) -> float:
        """Extra loss factor undoing FSDP's average over ranks (1 in one process)."""
        return float(self.world_size)

    # ---- the step -------------------------------------------------------------------------------
    def plan(self, items: list[SAWItem], pack: Callable[[list[SAWItem]], list[MB]]) -> list[MB]:
        """Micro-batches for this rank: ``pack(items)`` in one process; else the token-balanced share,
        padded to the most micro-batches any rank has with zero-weight repeats."""
        self._padding.clear()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
            self._alloc_before = torch.cuda.memory_allocated() / 2**20
        if not self.active:
            return pack(items)
        share = balanced_share(items, self.rank, self.world_size)
        mbs = pack(share) if share else []
        count = torch.tensor([len(mbs)], dtype=torch.long)
        target = int(all_reduce_tensor(count, "max", what="all-reduce of each rank's micro-batch count").item())
        filler = mbs[0] if mbs else pack([items[0]])[0]
        while len(mbs) < target:
            repeat = copy.copy(filler)  # a distinct object, so share_of can tell it from the real one
            self._padding.append(repeat)
            mbs.append(repeat)
        return mbs

    def share_of(self, micro_batch: Any, size: int, macro_size: int) -> float:
        """``size / macro_size``: this micro-batch's share of the macro-batch (0 for padding)."""
        return 0.0 if any(micro_batch is p for p in self._padding) else size / macro_size

    def step_scope(self, step: int) -> contextlib.AbstractContextManager[None]:
        """Around a whole step: a collective inside it that nothing names more closely still fails with
        ``PeerLost`` / ``WaitTimeout`` naming the step (``named_collective(catch_all=True)``)."""
        if not self.active:
            return contextlib.nullcontext()
        return named_collective(f"training step {step} (a collective not named more closely)", catch_all=True)

    @contextlib.contextmanager
    def grad_sync(self, model: nn.Module, *, last: bool) -> Iterator[None]:
        """Reduce-scatter gradients only in the backward of the last micro-batch; FSDP's collectives inside
        (all-gathers, the reduce-scatter) fail named (``collective_timeout.named_collective``)."""
        if not self.active:
            yield
            return
        model.set_requires_gradient_sync(last)  # type: ignore[operator]
        with named_collective("FSDP all-gather / reduce-scatter in a micro-batch's forward-backward"):
            yield

    def total_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The global L2 norm of all gradients, over every shard on every rank."""
        if not grads:
            return torch.zeros(())
        with named_collective("all-reduce of the gradient norm"):  # DTensor grads all-reduce in get_total_norm
            norm = torch.nn.utils.get_total_norm(grads)
            full = getattr(norm, "full_tensor", None)
            return full() if callable(full) else norm

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return all_reduce_tensor(t, "sum", what="all-reduce of the step's loss") if self.active else t

    # ---- stats ------------------------------------------------------------------------------
    def aggregate(self, micro_stats: Sequence[Mapping[str, Any]], weights: Sequence[StatWeight]) -> dict[str, float]:
        """Weighted mean of each stat over every rank's micro-batches (weights per micro-batch, or per
        micro-batch and stat: ``stats.MicroBatchWeight``)."""
        local = aggregate_stats(micro_stats, weights)
        if not self.active:
            return local
        totals: dict[str, float] = {}
        for stats, w in zip(micro_stats, weights):
            for k in stats:
                totals[k] = totals.get(k, 0.0) + stat_weight(w, k)
        keys = sorted({k for ks in all_gather_json(sorted(local), what="all-gather of the stats' names") for k in ks})
        packed = torch.tensor(
            [local.get(k, 0.0) * totals.get(k, 0.0) if k in local else 0.0 for k in keys]
            + [totals.get(k, 0.0) if k in local else 0.0 for k in keys],
            dtype=torch.float64,
        )
        summed = all_reduce_tensor(packed, "sum", what="all-reduce of the step's stats").tolist()
        n = len(keys)
        return {k: (summed[i] / summed[n + i] if summed[n + i] else math.nan) for i, k in enumerate(keys)}

    def used_items(self, items: list[SAWItem], local_used: list[SAWItem], max_seq_len: int) -> list[SAWItem]:
        """The items the whole step trained on (every rank's share), as batch stats should see them."""
        if not self.active:
            return local_used
        return [truncate_item(it, max_seq_len) for it in items]

    def perf_stats(self, token_stats: Mapping[str, float], seconds: float) -> dict[str, float]:
        """``perf/`` stats: reduced over ranks (token counts summed, time the slowest rank's), plus
        ``perf/rank{r}/...`` for every rank when there are several. Identical on every rank.
        ``seconds`` is the forward-backward and optimizer time (``perf/train_seconds``, which
        ``tokens_per_second`` divides by): no generation, preprocessing or publishing (see ``time/``)."""
        mem = _memory_stats()
        if "gpu_mem_peak_mb" in mem:
            mem["gpu_activation_peak_mb"] = mem["gpu_mem_peak_mb"] - self._alloc_before
        local = {**token_stats, "train_seconds": seconds, **mem}
        local["tokens_per_second"] = token_stats["real_tokens"] / max(seconds, 1e-9)
        if not self.active:
            return {f"perf/{k}": float(v) for k, v in local.items()}
        per_rank = all_gather_json({k: float(v) for k, v in local.items()}, what="all-gather of each rank's perf stats")
        out: dict[str, float] = {}
        for r, stats in enumerate(per_rank):
            out.update({f"perf/rank{r}/{k}": v for k, v in stats.items()})
        slowest = max(s["train_seconds"] for s in per_rank)
        for k in ("real_tokens", "computed_tokens", "distinct_tokens", "num_micro_batches"):
            out[f"perf/{k}"] = sum(s[k] for s in per_rank)
        computed = max(out["perf/computed_tokens"], 1.0)
        out["perf/padding_fraction"] = (out["perf/computed_tokens"] - out["perf/distinct_tokens"]) / computed
        out["perf/train_seconds"] = slowest
        out["perf/tokens_per_second"] = out["perf/real_tokens"] / max(slowest, 1e-9)
        for k in mem:
            out[f"perf/{k}"] = max(s[k] for s in per_rank)  # the worst rank bounds what fits
        return out

    def barrier(self) -> None:
        if self.active:
            with named_collective("barrier of the trainer ranks"):
                dist.barrier(device_ids=[comm_device().index] if comm_device().type == "cuda" else None)
