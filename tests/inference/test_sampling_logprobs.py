"""Log-probs of the distribution actually sampled: temperature on both sides, nucleus refused for ratios."""

from __future__ import annotations

import pytest
import torch

from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
from ludic.kernels.cpu.sampling_kernel import sample_with_logprobs
from ludic.testing import tiny_model_path
from ludic.training.algorithm import validate_actor_logps
from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.sampling_temperature import apply_sampling_temperature
from ludic.training.stats import staleness_stats
from ludic.training.types import SAWBatch

LOGITS = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])


def test_logprob_is_of_the_tempered_distribution():
    tokens, logps = sample_with_logprobs(LOGITS, torch.tensor([[0.5, 1.0]]), torch.tensor([0.3]))
    expected = torch.log_softmax(LOGITS / 0.5, dim=-1)[0, tokens[0]]
    assert float(logps[0]) == pytest.approx(float(expected), abs=1e-6)
    assert float(logps[0]) != pytest.approx(float(torch.log_softmax(LOGITS, -1)[0, tokens[0]]), abs=1e-3)


def test_nucleus_logprob_is_renormalised_over_the_kept_tokens():
    probs = torch.softmax(LOGITS[0], dim=-1)
    top_p = float(probs[0] + probs[1]) - 1e-3  # keeps tokens 0 and 1
    tokens, logps = sample_with_logprobs(LOGITS, torch.tensor([[1.0, top_p]]), torch.tensor([0.1]))
    assert tokens.tolist() == [0]
    kept = probs[0] / (probs[0] + probs[1])
    assert float(logps[0]) == pytest.approx(float(torch.log(kept)), abs=1e-6)


def test_greedy_rows_report_temperature_one_logprobs():
    tokens, logps = sample_with_logprobs(LOGITS, torch.tensor([[0.0, 0.5]]), torch.tensor([0.9]))
    assert tokens.tolist() == [0]
    assert float(logps[0]) == pytest.approx(float(torch.log_softmax(LOGITS, -1)[0, 0]), abs=1e-6)


async def test_engine_and_trainer_score_the_same_distribution_at_temperature_0_6():
    client = TransformersChatClient(tiny_model_path())
    request = ChatCompletionRequest(
        model="tiny", messages=[{"role": "user", "content": "hi"}],
        sampling=SamplingConfig(temperature=0.6, max_tokens=8, seed=3),
    )  # fmt: skip
    response, _ = await client.complete(request)
    prompt, completion = response.prompt_token_ids, response.completion_token_ids
    item = prompt_completion_item(prompt, completion, weight=1.0, meta={"sampling_temperature": 0.6})
    with torch.no_grad():
        raw = client.model(torch.tensor([prompt + completion])).logits.float()
    for logits, close in ((apply_sampling_temperature(raw, [item]), True), (raw, False)):
        logps = torch.log_softmax(logits, -1)[0]
        trainer = [float(logps[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]
        assert (trainer == pytest.approx(response.completion_logprobs, abs=1e-4)) is close


def test_ratio_losses_refuse_nucleus_sampled_items_with_the_reason():
    item = prompt_completion_item([1, 2], [3], weight=1.0, meta={"sampling_top_p": 0.9}, actor_logps=[-0.5])
    with pytest.raises(ValueError, match=r"top_p=0\.9.*top_p=1\.0"):
        validate_actor_logps(SAWBatch(items=[item]))
    item.meta["sampling_top_p"] = 1.0
    assert validate_actor_logps(SAWBatch(items=[item])).items == [item]


def test_staleness_is_trainer_version_minus_item_version():
    items = [prompt_completion_item([1], [2], weight=1.0, meta={"policy_version": v}) for v in (3, 5, None)]
    assert staleness_stats(items, trainer_version=5) == {"staleness_mean": 1.0, "staleness_max": 2.0}
    assert staleness_stats(items[2:], trainer_version=5) == {}


class _LogitsOnly:
    """A loss that takes the logits (not a TokenLogpLoss), so the trainer's logits path runs."""

    def __init__(self) -> None:
        from ludic.training.loss import TokenClippedSurrogateLoss

        self.inner = TokenClippedSurrogateLoss()

    def compute(self, logits, batch):
        return self.inner.compute(logits, batch)


@pytest.mark.parametrize("path", ["hidden-states", "logits"])
@pytest.mark.parametrize("pack", [True, False])
async def test_the_trainers_forward_matches_the_engines_tempered_logprobs(path, pack):
    from ludic.training.layout.forward import micro_batch_loss, plan_micro_batches
    from ludic.training.loss import TokenClippedSurrogateLoss

    client = TransformersChatClient(tiny_model_path())
    items = []
    for seed in range(4):
        request = ChatCompletionRequest(model="t", messages=[{"role": "user", "content": "-"}],
                                        sampling=SamplingConfig(temperature=0.6, max_tokens=6, seed=seed),
                                        prompt_token_ids=[5, 6, 7, 8])  # fmt: skip
        r, _ = await client.complete(request)
        items.append(prompt_completion_item(r.prompt_token_ids, r.completion_token_ids, weight=1.0,
                                            meta={"sampling_temperature": 0.6}, actor_logps=r.completion_logprobs))  # fmt: skip
    loss = TokenClippedSurrogateLoss() if path == "hidden-states" else _LogitsOnly()
    mbs = plan_micro_batches(client.model, items, micro_token_budget=256, max_seq_len=64, pack=pack)
    with torch.no_grad():
        _, stats, _ = micro_batch_loss(client.model, loss, mbs[0], pad_token_id=0, device=torch.device("cpu"))
    assert float(stats["mismatch_abs_mean"]) < 1e-4
    for it in mbs[0].items:
        it.meta["sampling_temperature"] = 1.0  # scored at the wrong temperature: the gap shows
    with torch.no_grad():
        _, stats, _ = micro_batch_loss(client.model, loss, mbs[0], pad_token_id=0, device=torch.device("cpu"))
    assert float(stats["mismatch_abs_mean"]) > 1e-2
