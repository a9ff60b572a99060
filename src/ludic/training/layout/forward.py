"""The policy forward for one micro-batch: packed or padded rows in, the loss and its stats out.

Two choices, both made per model and loss, never per algorithm:

* Layout. Models of an architecture whose packed forward a test shows equal to the plain one
  (``packing.PACKABLE_MODEL_TYPES``, with a mask-honouring attention kernel) train padding-free: sequences
  end to end in balanced rows, prompts shared inside GRPO groups (``training/layout/packing.py``). Others
  get right-padded rows split by token budget (``training/layout/micro_batching.py``). Packed rows of a
  model on SDPA run attention by blocks (``segment_attention.py``: each sequence, prompt and tail
  against its own keys only), others over the rows' dense 4D mask. The split into micro-batches, and the
  activation budget each keeps to, is ``training/layout/micro_batch_plan.py``'s (re-exported here).
* Log-probs. For losses that read only the policy's token log-probs (``TokenLogpLoss``) and models
  whose output layer is a plain ``nn.Linear`` after the decoder, the action tokens' log-probs come
  from the last hidden states through the output layer in chunks (``training/loss/head_logps.py``): the
  [B, T, V] logits never exist. Other losses get the logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, TypeGuard

import torch
from torch import Tensor, nn

from ludic.kernels import CpuKernels, select
from ludic.kernels.cpu.onednn_linear import onednn_linears
from ludic.kernels.cpu.recompute import recomputing_layers
from ludic.kernels.cpu.tied_embedding import tied_embedding_grads
from ludic.training._setup import forward_logits
from ludic.training.layout.flex_attention import block_attention as block_attention_kernel
from ludic.training.layout.flex_attention import block_inputs, model_device
from ludic.training.layout.micro_batch_plan import (  # re-exported: planning lived here before
    ACTIVATION_BUDGET_BYTES,
    CUDA_PACKED_MAX_RATIO,
    MicroBatch,
    activation_bytes_per_token,
    activation_token_cap,
    plan_micro_batches,
    recomputes_layers,
)
from ludic.training.layout.micro_batching import collate_saw_items
from ludic.training.layout.packing import PACKABLE_MODEL_TYPES, PackedBatch, pack_plan
from ludic.training.loss.base import Loss, TokenLogpLoss, compute_token_logps
from ludic.training.loss.composite import CompositeLoss
from ludic.training.loss.head_logps import head_token_logps
from ludic.training.parallel.fsdp import is_fsdp_model
from ludic.training.sampling_temperature import apply_sampling_temperature, item_temperatures

__all__ = [
    "ACTIVATION_BUDGET_BYTES",
    "CUDA_PACKED_MAX_RATIO",
    "MicroBatch",
    "action_token_logps",
    "activation_bytes_per_token",
    "activation_token_cap",
    "micro_batch_kernels",
    "micro_batch_loss",
    "micro_batch_token_logps",
    "output_layer",
    "plan_micro_batches",
    "recomputes_layers",
    "takes_token_logps",
]

@contextlib.contextmanager
def micro_batch_kernels(
    model: nn.Module, mb: MicroBatch, *, onednn: bool = True, cpu_kernels: CpuKernels | None = None
) -> Iterator[None]:
    """The kernels ``mb``'s forward and backward run with: oneDNN linears (``onednn``, fp32 on the CPU,
    where ``cpu_kernels`` allows them and the model is not FSDP2-sharded), gated MLPs and RMSNorms that
    recompute their elementwise parts in the backward (``kernels/cpu/recompute.py``; likewise) and, for
    block-attention micro-batches, the model switched to its device's block kernel (``flex_attention.block_attention``).
    A tied input embedding's gradient goes into the weight's ``.grad`` row by row (``kernels/cpu/tied_embedding.py``;
    likewise, not under FSDP). Wrap both the forward and the backward (activation checkpointing recomputes the
    forward inside the backward)."""
    choice, fsdp = select(model_device(model), cpu_kernels), is_fsdp_model(model)
    onednn = onednn and choice.onednn_linear and not fsdp
    with (
        onednn_linears(model, onednn),
        recomputing_layers(model, choice.recompute_layers and not fsdp, onednn=onednn, native_swiglu=choice.swiglu,
                           native_rms_norm=choice.rms_norm),  # fmt: skip
        tied_embedding_grads(model, choice.tied_embedding_grad and not fsdp),
        block_attention_kernel(model, enabled=mb.block_attention),
    ):
        yield


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
