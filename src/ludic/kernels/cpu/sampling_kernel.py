"""Per-row token sampling for a batch of logits: temperature, nucleus (top_p) and greedy rows in one pass."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class SamplingPlan:
    """Which passes a batch's draw needs, decided once on the host from its rows' (temperature, top_p).

    Without one, ``sample_with_logprobs`` reads the answers back from ``params`` at every call: on a GPU
    that is a device-to-host wait per decoding step. A plan made for a batch holds for any subset of its
    rows (the live rows of a later step): a pass it asks for that the subset does not need changes nothing
    (the division by 1, the argmax of no greedy row), and the nucleus path gives a row without a nucleus
    the short path's token (its log-prob to fp32 rounding), as it does in any batch mixing both."""

    divide: bool  # some row has a temperature other than 0 (greedy) and 1
    any_greedy: bool  # some row has temperature 0
    nucleus: bool  # some row has top_p < 1

    @classmethod
    def of(cls, settings: Iterable[tuple[float, float]]) -> SamplingPlan:
        """The plan for rows of ``(temperature, top_p)``, read as the fp32 params the draw gets (a
        temperature that rounds to 0 there is greedy here too)."""
        return cls.of_params(torch.tensor([[float(t), float(p)] for t, p in settings], dtype=torch.float32))

    @classmethod
    def of_params(cls, params: torch.Tensor) -> SamplingPlan:
        """The plan read from ``params [B, 2]`` (a wait for the device when they live on one)."""
        temperature, top_p = params[:, 0], params[:, 1]
        greedy = temperature == 0
        return cls(
            divide=bool(((temperature != 1) & ~greedy).any()),
            any_greedy=bool(greedy.any()),
            nucleus=bool((top_p < 1.0).any()),
        )


def sample_tokens(logits: torch.Tensor, params: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The sampled token ids only (see ``sample_with_logprobs``)."""
    return sample_with_logprobs(logits, params, uniforms)[0]


def sample_with_logprobs(
    logits: torch.Tensor, params: torch.Tensor, uniforms: torch.Tensor, plan: SamplingPlan | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorised per-row sampling by inverse CDF; returns (token ids [B], their log-probs [B]).

    logits [B, V]; params [B, 2] = (temperature, top_p); uniforms [B] drawn from each row's own
    generator. Temperature 0 rows are greedy. Nucleus: keep the smallest prefix of the sorted
    distribution whose mass reaches top_p (always at least one token).

    The log-probs are those of the distribution actually sampled from (vLLM's
    ``processed_logprobs``): log softmax(logits / T), renormalised over the nucleus when top_p < 1.
    Greedy rows report temperature-1 log-probs. The trainer divides its logits by the same T.
    ``plan``: the batch's ``SamplingPlan`` (read from ``params`` when None).
    """
    plan = SamplingPlan.of_params(params) if plan is None else plan
    temperature, top_p = params[:, 0], params[:, 1]
    greedy = temperature == 0
    # x / 1 == x exactly: a batch sampled at temperature 1 (GRPO's usual) skips a pass over [B, V]
    scaled = logits.float() / torch.where(greedy, 1.0, temperature)[:, None] if plan.divide else logits.float()
    # one pass for the probabilities; a token's log-prob is log p of that token alone (to fp32 rounding of
    # log_softmax's: a drawn token has p > 0), not a second pass over [B, V] for log_softmax and exp
    probs = torch.softmax(scaled, dim=-1)  # [B, V]
    whole = top_p >= 1.0  # rows without a nucleus draw in vocabulary order, whatever else is in the batch
    if not plan.nucleus:  # no nucleus to cut: skip the vocabulary sort
        tokens = _vocab_order_pick(probs, uniforms)
        if plan.any_greedy:  # the argmax pass only when some row is greedy
            tokens = torch.where(greedy, torch.argmax(logits, dim=-1), tokens)
        return tokens, probs.gather(-1, tokens[:, None]).squeeze(-1).log()
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    drop = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > top_p[:, None]
    drop = drop & ~greedy[:, None]  # greedy rows keep their full distribution
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    cdf = torch.cumsum(sorted_probs, dim=-1)
    target = (uniforms * cdf[:, -1]).unsqueeze(-1)
    pick = torch.searchsorted(cdf, target).clamp(max=cdf.shape[-1] - 1)
    sampled = torch.where(whole, _vocab_order_pick(probs, uniforms), order.gather(-1, pick).squeeze(-1))
    tokens = torch.where(greedy, torch.argmax(logits, dim=-1), sampled)
    # log p_nucleus(x) = log p(x) - log(mass kept): the renormalised nucleus distribution
    logps = probs.gather(-1, tokens[:, None]).squeeze(-1).log() - torch.log(cdf[:, -1])
    return tokens, logps


PICK_BLOCK = 64
"""Tokens per block of the two-level inverse-CDF search in ``_vocab_order_pick``."""


def _vocab_order_pick(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """[B] the token where each row's cumulative mass (vocabulary order) first reaches ``u * total``.

    In two levels rather than one cumsum over the vocabulary (a second full pass over [B, V], 1.6 ms of
    a ~54 ms decoding step at 32 x 49,152): the running sum over blocks of ``PICK_BLOCK`` tokens finds
    the block, a cumsum inside it the token. The sums run in another order than one cumsum, so a draw
    within fp32 rounding of a token boundary may land on the neighbouring token; it never lands on a
    token without mass (``_last_with_mass``)."""
    rows, vocab = probs.shape
    if vocab < 4 * PICK_BLOCK:
        cdf = torch.cumsum(probs, dim=-1)
        pick = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1)).clamp(max=vocab - 1)
        return pick.squeeze(-1)
    pad = -vocab % PICK_BLOCK
    blocks = (F.pad(probs, (0, pad)) if pad else probs).view(rows, -1, PICK_BLOCK)  # [B, nb, block]
    block_cdf = blocks.sum(-1).cumsum(-1)  # [B, nb]
    target = (uniforms * block_cdf[:, -1]).unsqueeze(-1)  # [B, 1]
    block = torch.searchsorted(block_cdf, target).clamp(max=blocks.shape[1] - 1)  # [B, 1]
    before = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp(min=0)), 0.0)  # mass of earlier blocks
    inner = blocks.gather(1, block.unsqueeze(-1).expand(-1, -1, PICK_BLOCK)).squeeze(1)  # [B, block]
    pos = torch.searchsorted(before + inner.cumsum(-1), target).squeeze(-1)  # PICK_BLOCK: past it by rounding
    return block.squeeze(-1) * PICK_BLOCK + torch.minimum(pos, _last_with_mass(inner))


def _last_with_mass(inner: torch.Tensor) -> torch.Tensor:
    """[B] the last position of each row of ``inner`` [B, block] with a probability above 0."""
    return inner.shape[-1] - 1 - (inner.flip(-1) > 0).to(torch.int8).argmax(-1)
