"""How a macro-batch is split into micro-batches: packed or padded rows, each within a token budget and an
estimate of the activations its backward keeps.

``plan_micro_batches`` decides per model, never per algorithm: models of an architecture whose packed
forward equals the plain one train padding-free (``training/layout/packing.py``: sequences end to end,
prompts shared inside GRPO groups, attention by blocks on SDPA); others get right-padded rows split by token
budget (``training/layout/micro_batching.py``). Either way no micro-batch keeps more activations than
``ACTIVATION_BUDGET_BYTES`` (``activation_bytes_per_token``). ``training/layout/forward.py`` runs the forward
of each ``MicroBatch`` this returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ludic.kernels import CpuKernels, select
from ludic.kernels.cpu.recompute import switchable_layers
from ludic.kernels.cpu.segment_attention import can_switch
from ludic.training.layout.flex_attention import has_block_kernel, model_device
from ludic.training.layout.micro_batching import split_items_by_token_budget
from ludic.training.layout.packing import (
    ATTENTION_WEIGHT,
    PackPlan,
    can_pack,
    plan_packed_micro_batches,
    supports_packing,
    truncated,
)
from ludic.training.layout.shared_prefix import prompt_groups
from ludic.training.layout.token_arrays import num_tokens
from ludic.training.parallel.fsdp import is_fsdp_model
from ludic.training.types import SAWItem

CUDA_PACKED_MAX_RATIO = 0.5
"""On a GPU, pack only when the packed rows run at most this fraction of the padded positions.

The padded forward there uses flash attention, the packed one a dense 4D mask (no flash kernel):
on an H100 (bf16, 200M params) a layout at 0.29x the positions ran 1.56x faster, one at 0.52x ran
0.66x as fast (``bench/bench_shared_prefix.py``). The CPU has no such kernel gap; there the cost
estimate in ``plan_packed_micro_batches`` decides alone. Untested on a GPU since packing landed.
With block attention (on CUDA FlexAttention, ``flex_attention.py``, which skips masked tiles) the
gap should be smaller, but that has not run on a GPU, so the rule stays for both until
``scripts/gpu_check.sh`` measures it (``plan_micro_batches(cuda_packed_max_ratio=None)`` turns it off).
"""

ACTIVATION_BUDGET_BYTES = 768 << 20
"""The activations one micro-batch may keep for its backward (estimated by ``activation_bytes_per_token``).

A token budget alone does not bound memory across model sizes: ``TrainerConfig.micro_token_budget``'s
default of 16,384 tokens is 22 GB of activations at SmolLM2-135M. There, one GRPO step (4 prompts x 8
samples x 64 tokens, 2,088 packed positions) as one micro-batch peaked 5.5 GB above the weights and
gradients; in micro-batches of at most ~560 positions (this budget) 1.9 GB, at the same CPU time
(15.1-15.8 s against 17.5 s of one core, 1 thread; 400 positions: 5% more time, 0.23 GB less)."""


def activation_bytes_per_token(
    model: nn.Module, cpu_kernels: CpuKernels | None = None, keep_head_logits: bool = False
) -> int | None:
    """What a decoder's forward keeps per token for its backward, from its config (None: unknown).

    Per layer: the MLP's gate, up, activation and product (4 x intermediate) and about ten hidden-size
    tensors (norm inputs and outputs, q/k/v, attention output, residuals); measured 11.4k floats per
    token per layer at SmolLM2-135M, where this gives 11.9k. Where ``cpu_kernels`` switches the model's
    layers to ``kernels/cpu/recompute.py``, the MLP keeps gate and up only and each norm its input only:
    2 x intermediate + 8 x hidden. With ``keep_head_logits``, plus each position's float32 logits row
    (4 x vocabulary bytes) that the output layer's tiles keep for the backward (``MicroBatch.keep_head_logits``)."""
    config = getattr(model, "config", None)
    sizes = [getattr(config, k, None) for k in ("num_hidden_layers", "hidden_size", "intermediate_size")]
    if not all(isinstance(v, int) and v > 0 for v in sizes):
        return None
    layers, hidden, intermediate = sizes
    vocab = getattr(config, "vocab_size", None)
    logits_row = 4 * vocab if keep_head_logits and isinstance(vocab, int) and vocab > 0 else 0
    itemsize = next(model.parameters()).element_size()
    if recomputes_layers(model, cpu_kernels):
        return layers * (2 * intermediate + 8 * hidden) * itemsize + logits_row
    return layers * (4 * intermediate + 10 * hidden) * itemsize + logits_row


def recomputes_layers(model: nn.Module, cpu_kernels: CpuKernels | None = None) -> bool:
    """Whether ``micro_batch_kernels`` runs ``model``'s MLPs and norms through ``kernels/cpu/recompute.py``."""
    if not select(model_device(model), cpu_kernels).recompute_layers or is_fsdp_model(model):
        return False
    return any(True for _ in switchable_layers(model))


def activation_token_cap(
    model: nn.Module, budget_bytes: int | None, cpu_kernels: CpuKernels | None = None, keep_head_logits: bool = False
) -> int | None:
    """Tokens per micro-batch whose activations fit ``budget_bytes`` (None: no cap: no budget, an unknown
    model, or activation checkpointing on, which keeps only each layer's input)."""
    per_token = activation_bytes_per_token(model, cpu_kernels, keep_head_logits)
    flag = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else "is_gradient_checkpointing"
    if budget_bytes is None or per_token is None or getattr(model, flag, False):
        return None
    return max(1, budget_bytes // per_token)


@dataclass
class MicroBatch:
    """Items trained together, their packing plan (None: plain right-padded rows), whether the
    packed rows run attention by blocks (``segment_attention.py``) rather than over a dense mask, and
    whether the output layer keeps its logits for the backward (``head_logps.head_token_logps``)."""

    items: list[SAWItem]
    plan: PackPlan | None = None
    block_attention: bool = False
    keep_head_logits: bool = False


def plan_micro_batches(
    model: nn.Module,
    items: list[SAWItem],
    *,
    micro_token_budget: int,
    max_seq_len: int,
    pack: bool = True,
    share_prompt_prefix: bool = True,
    block_attention: bool = True,
    cuda_packed_max_ratio: float | None = CUDA_PACKED_MAX_RATIO,
    cpu_kernels: CpuKernels | None = None,
    activation_budget_bytes: int | None = ACTIVATION_BUDGET_BYTES,
    keep_head_logits: bool = False,
) -> list[MicroBatch]:
    """Split a macro-batch into micro-batches: packed when the model supports it, padded otherwise.

    Each holds at most ``micro_token_budget`` positions and at most what fits ``activation_budget_bytes``
    of activations (``activation_token_cap``; never fewer than the longest sequence; None: no cap).

    ``block_attention``: packed rows of a model on SDPA run attention by blocks, not a dense mask
    (bucketed SDPA on the CPU where ``cpu_kernels`` allows it, FlexAttention on CUDA:
    ``flex_attention.block_kernel``).
    ``cuda_packed_max_ratio``: on CUDA pack only at most this fraction of the padded positions
    (``CUDA_PACKED_MAX_RATIO``); None: pack whenever the cost estimate says so, as on the CPU.
    ``keep_head_logits``: the micro-batches' output layer keeps its logits for the backward (counted in
    the activation budget) instead of recomputing them there.
    """
    cap = activation_token_cap(model, activation_budget_bytes, cpu_kernels, keep_head_logits)
    if cap is not None and items and cap < micro_token_budget:
        longest = min(max_seq_len, max(num_tokens(it) for it in items))  # every sequence still fits whole
        micro_token_budget = max(cap, longest)
        max_seq_len = min(max_seq_len, max(longest, 1))  # truncates exactly as before: no item is longer
    mbs = split_items_by_token_budget(items, micro_token_budget=micro_token_budget, max_seq_len=max_seq_len)
    cut = [it for mb in mbs for it in mb]  # truncated, validated
    if not (pack and can_pack(cut) and supports_packing(model, max(num_tokens(it) for it in cut))):
        return [MicroBatch(mb, keep_head_logits=keep_head_logits) for mb in mbs]
    cut = truncated(items, max_seq_len)  # input order: groups keep their members in order
    groups = prompt_groups(cut) if share_prompt_prefix else [[i] for i in range(len(cut))]
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    weight = 1 / (6 * hidden) if isinstance(hidden, int) and hidden > 0 else ATTENTION_WEIGHT
    blocks = block_attention and can_switch(model) and has_block_kernel(model, cpu_kernels)
    plans = plan_packed_micro_batches(
        cut, groups, micro_token_budget=micro_token_budget, attention_weight=weight, dense_attention=not blocks
    )
    if cuda_packed_max_ratio is not None and _on_cuda(model) and (
        _positions(plans) > cuda_packed_max_ratio * sum(_padded(mb) for mb in mbs)
    ):
        return [MicroBatch(mb, keep_head_logits=keep_head_logits) for mb in mbs]
    return [MicroBatch(plan.items, plan, blocks, keep_head_logits) for plan in plans]



def _on_cuda(model: nn.Module) -> bool:
    return any(p.is_cuda for p in model.parameters())


def _positions(plans: list[PackPlan]) -> int:
    return sum(len(p.rows) * p.row_length for p in plans)


def _padded(mb: list[SAWItem]) -> int:
    return len(mb) * max(num_tokens(it) for it in mb)
