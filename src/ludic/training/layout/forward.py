"""The policy forward for one micro-batch: packed or padded rows in, the loss and its stats out.

Two choices, both made per model and loss, never per algorithm:

* Layout. Models of an architecture whose packed forward a test shows equal to the plain one
  (``packing.PACKABLE_MODEL_TYPES``, with a mask-honouring attention kernel) train padding-free: sequences
  end to end in balanced rows, prompts shared inside GRPO groups (``training/layout/packing.py``). Others
  get right-padded rows split by token budget (``training/layout/micro_batching.py``). Packed rows of a
  model on SDPA run attention by blocks (``segment_attention.py``: each sequence, prompt and tail
  against its own keys only), others over the rows' dense 4D mask.
* Log-probs. For losses that read only the policy's token log-probs (``TokenLogpLoss``) and models
  whose output layer is a plain ``nn.Linear`` after the decoder, the action tokens' log-probs come
  from the last hidden states through the output layer in chunks (``training/loss/head_logps.py``): the
  [B, T, V] logits never exist. Other losses get the logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import torch
from torch import Tensor, nn

from ludic.kernels import CpuKernels, select
from ludic.kernels.cpu.onednn_linear import onednn_linears
from ludic.kernels.cpu.recompute import recomputing_layers, switchable_layers
from ludic.kernels.cpu.segment_attention import can_switch
from ludic.training._setup import forward_logits
from ludic.training.layout.flex_attention import block_attention as block_attention_kernel
from ludic.training.layout.flex_attention import block_inputs, has_block_kernel, model_device
from ludic.training.layout.micro_batching import collate_saw_items, split_items_by_token_budget
from ludic.training.layout.packing import (
    ATTENTION_WEIGHT,
    PACKABLE_MODEL_TYPES,
    PackedBatch,
    PackPlan,
    can_pack,
    pack_plan,
    plan_packed_micro_batches,
    supports_packing,
    truncated,
)
from ludic.training.layout.shared_prefix import prompt_groups
from ludic.training.layout.token_arrays import num_tokens
from ludic.training.loss.base import Loss, TokenLogpLoss, compute_token_logps
from ludic.training.loss.composite import CompositeLoss
from ludic.training.loss.head_logps import head_token_logps
from ludic.training.parallel.fsdp import is_fsdp_model
from ludic.training.sampling_temperature import apply_sampling_temperature, item_temperatures
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


@contextlib.contextmanager
def micro_batch_kernels(
    model: nn.Module, mb: MicroBatch, *, onednn: bool = True, cpu_kernels: CpuKernels | None = None
) -> Iterator[None]:
    """The kernels ``mb``'s forward and backward run with: oneDNN linears (``onednn``, fp32 on the CPU,
    where ``cpu_kernels`` allows them and the model is not FSDP2-sharded), gated MLPs and RMSNorms that
    recompute their elementwise parts in the backward (``kernels/cpu/recompute.py``; likewise) and, for
    block-attention micro-batches, the model switched to its device's block kernel (``flex_attention.block_attention``).
    Wrap both the forward and the backward (activation checkpointing recomputes the forward inside the
    backward)."""
    choice, fsdp = select(model_device(model), cpu_kernels), is_fsdp_model(model)
    onednn = onednn and choice.onednn_linear and not fsdp
    with (
        onednn_linears(model, onednn),
        recomputing_layers(model, choice.recompute_layers and not fsdp, onednn=onednn),
        block_attention_kernel(model, enabled=mb.block_attention),
    ):
        yield


def _on_cuda(model: nn.Module) -> bool:
    return any(p.is_cuda for p in model.parameters())


def _positions(plans: list[PackPlan]) -> int:
    return sum(len(p.rows) * p.row_length for p in plans)


def _padded(mb: list[SAWItem]) -> int:
    return len(mb) * max(num_tokens(it) for it in mb)


def _model_inputs(
    model: nn.Module, mb: MicroBatch, *, pad_token_id: int, device: torch.device
) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor | None, PackedBatch | None, int]:
    """(batch the loss reads, the model's inputs, gather index, packed batch, positions computed)."""
    if mb.plan is not None:
        dtype = next(model.parameters()).dtype
        packed = pack_plan(
            mb.plan, pad_token_id=pad_token_id, device=device, dtype=dtype, dense_mask=not mb.block_attention
        )
        inputs: dict[str, Any] = {"input_ids": packed.input_ids, "position_ids": packed.position_ids}
        if packed.blocks is not None:  # the block kernel reads the blocks or a BlockMask, not a mask
            inputs.update(block_inputs(packed))
        else:
            inputs["attention_mask"] = packed.attention_mask
        return packed.view, inputs, packed.gather_index, packed, packed.computed_tokens
    batch = collate_saw_items(mb.items, pad_token_id=pad_token_id, device=device)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    return batch, inputs, None, None, int(batch["input_ids"].numel())


def micro_batch_token_logps(
    model: nn.Module, mb: MicroBatch, *, pad_token_id: int, device: torch.device
) -> tuple[dict[str, Tensor], Tensor]:
    """(collated batch, ``[B, T]`` log-probs of its action tokens) by the same path the loss uses.

    For frozen-model scoring (``training/reference/scoring.py``); call it under ``torch.no_grad()``.
    """
    batch, inputs, gather, packed, _ = _model_inputs(model, mb, pad_token_id=pad_token_id, device=device)
    head = output_layer(model)
    with block_attention_kernel(model, enabled=mb.block_attention):
        if head is not None:
            hidden = model.get_decoder()(**inputs, use_cache=False).last_hidden_state  # [R, L, H]
            return batch, action_token_logps(hidden, head, batch, gather)
        logits = _packed_logits(model, inputs, packed) if packed is not None else forward_logits(model, batch)
    return batch, compute_token_logps(logits, batch["input_ids"]) * batch["action_mask"]


def micro_batch_loss(
    model: nn.Module, loss: Loss, mb: MicroBatch, *, pad_token_id: int, device: torch.device
) -> tuple[Tensor, Mapping[str, Tensor], int]:
    """(loss, stats, positions the forward computed) for one micro-batch: ``loss.compute(logits, batch)``,
    or for a loss of token log-probs only (``takes_token_logps``) its ``compute_from_logps``."""
    batch, inputs, gather, packed, computed = _model_inputs(
        model, mb, pad_token_id=pad_token_id, device=device
    )
    head = output_layer(model)
    temps = item_temperatures(mb.items, device)  # [B] or None when every item was sampled at T = 1
    with block_attention_kernel(model, enabled=mb.block_attention):  # a no-op inside micro_batch_kernels
        if head is not None and takes_token_logps(loss) and (temps is None or head.bias is None):
            hidden = model.get_decoder()(**inputs, use_cache=False).last_hidden_state  # [R, L, H]
            policy_logps = action_token_logps(hidden, head, batch, gather, temps, keep_logits=mb.keep_head_logits)
            mb_loss, stats = loss.compute_from_logps(policy_logps, batch)
            return mb_loss, stats, computed
        if packed is not None:
            logits = _packed_logits(model, inputs, packed)
        else:
            logits = forward_logits(model, batch)
    logits = apply_sampling_temperature(logits, mb.items)  # score under the distribution sampled
    mb_loss, stats = loss.compute(logits, batch)
    return mb_loss, stats, computed


def _packed_logits(model: nn.Module, inputs: dict[str, Tensor], packed: PackedBatch) -> Tensor:
    out = model(**inputs, use_cache=False)
    logits = out.logits if hasattr(out, "logits") else out
    R, L, V = logits.shape
    return logits.reshape(R * L, V)[packed.gather_index]  # [B, Tv, V]


def output_layer(model: nn.Module) -> nn.Linear | None:
    """The model's output layer when its logits are exactly ``head(decoder(...).last_hidden_state)``."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PACKABLE_MODEL_TYPES or not hasattr(model, "get_decoder"):
        return None
    if is_fsdp_model(model):  # FSDP2 gathers the root's weights (embeddings, head) only in model.forward
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head if type(head) is nn.Linear else None  # a LoRA- or FSDP-wrapped head: use the logits


def takes_token_logps(loss: Loss) -> TypeGuard[TokenLogpLoss | CompositeLoss]:
    """True for losses that read the logits only through the policy's token log-probs."""
    if isinstance(loss, CompositeLoss):
        return all(isinstance(term.loss, TokenLogpLoss) for term in loss.terms)
    return isinstance(loss, TokenLogpLoss)


def action_token_logps(
    hidden: Tensor, head: nn.Linear, batch: dict[str, Tensor], gather: Tensor | None,
    temperatures: Tensor | None = None, *, keep_logits: bool = False,
) -> Tensor:
    """``[B, T]`` policy log-probs of ``batch``'s action tokens (0 elsewhere) from hidden states.

    Token ``t`` is scored by the hidden state at ``t - 1``; ``gather`` [B, T] maps each batch
    position to its row in ``hidden`` flattened (None: the batch is the hidden states' own layout).
    ``temperatures`` [B]: each row's sampling temperature; with a bias-free head,
    logits / T = (hidden / T) @ W^T, so the hidden states are scaled instead of the logits.
    ``keep_logits``: the output layer's tiles keep their logits for the backward (``head_token_logps``).
    """
    ids, action = batch["input_ids"], batch["action_mask"]
    B, T = ids.shape
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])  # [R * L, H]
    where = torch.arange(B * T, device=ids.device).view(B, T)
    source = where if gather is None else gather
    scored = action[:, 1:].bool()  # [B, T-1]: positions 1.. that are action tokens
    rows = flat_hidden[source[:, :-1][scored]]  # [N, H]
    if temperatures is not None:
        row_of = torch.arange(B, device=ids.device)[:, None].expand(B, T - 1)[scored]  # [N]
        rows = rows / temperatures.to(rows.dtype)[row_of][:, None]
    values = head_token_logps(rows, head.weight, head.bias, ids[:, 1:][scored], keep_logits=keep_logits)  # [N]
    out = torch.zeros(B * T, dtype=values.dtype, device=values.device)
    return out.index_put((where[:, 1:][scored],), values).view(B, T)
