"""Per-row token sampling for a batch of logits: temperature, nucleus (top_p) and greedy rows in one pass."""

from __future__ import annotations

import torch


def sample_tokens(logits: torch.Tensor, params: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The sampled token ids only (see ``sample_with_logprobs``)."""
    return sample_with_logprobs(logits, params, uniforms)[0]


def sample_with_logprobs(
    logits: torch.Tensor, params: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorised per-row sampling by inverse CDF; returns (token ids [B], their log-probs [B]).

    logits [B, V]; params [B, 2] = (temperature, top_p); uniforms [B] drawn from each row's own
    generator. Temperature 0 rows are greedy. Nucleus: keep the smallest prefix of the sorted
    distribution whose mass reaches top_p (always at least one token).

    The log-probs are those of the distribution actually sampled from (vLLM's
    ``processed_logprobs``): log softmax(logits / T), renormalised over the nucleus when top_p < 1.
    Greedy rows report temperature-1 log-probs. The trainer divides its logits by the same T.
    """
    temperature, top_p = params[:, 0], params[:, 1]
    greedy = temperature == 0
    divisor = torch.where(greedy, 1.0, temperature)
    # x / 1 == x exactly: a batch sampled at temperature 1 (GRPO's usual) skips a pass over [B, V]
    scaled = logits.float() if bool((divisor == 1).all()) else logits.float() / divisor[:, None]
    log_probs = torch.log_softmax(scaled, dim=-1)  # [B, V]
    probs = log_probs.exp()
    whole = top_p >= 1.0  # rows without a nucleus draw in vocabulary order, whatever else is in the batch
    if bool(whole.all()):  # no nucleus to cut: skip the vocabulary sort
        tokens = _vocab_order_pick(probs, uniforms)
        if bool(greedy.any()):  # the argmax pass only when some row is greedy
            tokens = torch.where(greedy, torch.argmax(logits, dim=-1), tokens)
        return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)
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
    logps = log_probs.gather(-1, tokens[:, None]).squeeze(-1) - torch.log(cdf[:, -1])
    return tokens, logps


def _vocab_order_pick(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """[B] the token where each row's cumulative mass (vocabulary order) first reaches ``u * total``."""
    cdf = torch.cumsum(probs, dim=-1)
    pick = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1)).clamp(max=cdf.shape[-1] - 1)
    return pick.squeeze(-1)
