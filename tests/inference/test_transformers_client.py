"""The embedded engine: exact token-in/token-out, batching, seeded sampling, atomic weight swaps."""

import asyncio

import pytest
import torch

from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
from ludic.testing import tiny_model_path


@pytest.fixture(scope="module")
def client() -> TransformersChatClient:
    return TransformersChatClient(tiny_model_path())


def _req(content: str = "hello", **sampling) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="tiny", messages=[{"role": "user", "content": content}], sampling=SamplingConfig(**sampling)
    )


def _forward_logps(client: TransformersChatClient, prompt: list[int], completion: list[int]) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logps = torch.log_softmax(client.model(ids).logits.float(), dim=-1)
    return [float(logps[0, len(prompt) - 1 + i, tok]) for i, tok in enumerate(completion)]


async def test_returned_ids_and_logprobs_are_exactly_what_was_sampled(client):
    response, info = await client.complete(_req(max_tokens=12, seed=7))
    assert response.prompt_token_ids == client.prompt_ids_for(_req())
    assert len(response.completion_token_ids) == len(response.completion_logprobs) >= 1
    recomputed = _forward_logps(client, response.prompt_token_ids, response.completion_token_ids)
    assert recomputed == pytest.approx(response.completion_logprobs, abs=1e-4)
    assert info["policy_version"] == response.policy_version == client.policy_version


async def test_token_in_request_samples_from_the_given_ids(client):
    prompt = client.tokenizer.encode("abc", add_special_tokens=False)
    request = ChatCompletionRequest(
        model="tiny",
        messages=[{"role": "user", "content": "ignored"}],
        sampling=SamplingConfig(max_tokens=4, seed=1),
        prompt_token_ids=prompt,
    )
    response, _ = await client.complete(request)
    assert response.prompt_token_ids == prompt


async def test_greedy_is_deterministic_and_max_tokens_gives_length(client):
    a, _ = await client.complete(_req(temperature=0.0, max_tokens=6))
    b, _ = await client.complete(_req(temperature=0.0, max_tokens=6))
    assert a.completion_token_ids == b.completion_token_ids
    if a.finish_reason == "length":
        assert len(a.completion_token_ids) == 6


async def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(client):
    alone, _ = await client.complete(_req("x", max_tokens=16, seed=11))
    batch = await asyncio.gather(*[client.complete(_req(f"p{i}", max_tokens=16, seed=i)) for i in range(6)])
    mixed = await asyncio.gather(
        client.complete(_req("x", max_tokens=16, seed=11)),
        *[client.complete(_req(f"o{i}", max_tokens=9, seed=i)) for i in range(5)],
    )
    in_batch = mixed[0][0]
    assert len(batch) == 6
    assert in_batch.completion_token_ids == alone.completion_token_ids
    other, _ = await client.complete(_req("x", max_tokens=16, seed=12))
    assert other.completion_token_ids != alone.completion_token_ids


async def test_concurrent_requests_share_forward_passes(client):
    before = client.forward_calls
    responses = await asyncio.gather(
        *[client.complete(_req(f"q{i}", max_tokens=8, seed=i)) for i in range(16)]
    )
    used = client.forward_calls - before
    longest = max(len(r.completion_token_ids) for r, _ in responses)
    assert used == longest  # one prefill + one forward per later decoding step, for all 16 rows
    assert used < sum(len(r.completion_token_ids) for r, _ in responses)


async def test_stop_string_ends_the_completion_and_is_cut_from_text(client):
    # find what greedy decoding produces, then stop on a piece of it
    full, _ = await client.complete(_req("stop test", temperature=0.0, max_tokens=10))
    if len(full.text) < 3:
        pytest.fail(f"greedy completion too short to pick a stop string: {full.text!r}")
    stop = full.text[1:3]
    cut, _ = await client.complete(_req("stop test", temperature=0.0, max_tokens=10, stop=[stop]))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    assert len(cut.completion_token_ids) <= len(full.completion_token_ids)


async def test_sync_weights_swaps_weights_and_bumps_version():
    client = TransformersChatClient(tiny_model_path())
    before, _ = await client.complete(_req(temperature=0.0, max_tokens=8))
    new = {k: v + 0.5 * torch.randn_like(v) for k, v in client.model.state_dict().items() if "mlp" in k}
    status = client.sync_weights(new, version=5)
    assert "policy_version=5" in status and await client.get_policy_version() == 5
    after, _ = await client.complete(_req(temperature=0.0, max_tokens=8))
    assert after.policy_version == 5
    assert after.completion_logprobs != before.completion_logprobs


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ({"model.not_a_layer.weight": torch.zeros(2)}, KeyError, "unknown parameter names"),
        (
            {"model.norm.weight": torch.zeros(7)},
            ValueError,
            r"'model.norm.weight' has shape \(7,\), expected \(128,\)",
        ),
        ({"model.norm.weight": torch.full((128,), float("nan"))}, ValueError, "NaN or inf"),
    ],
)
async def test_bad_state_dict_is_rejected_and_old_weights_keep_serving(bad, error, match):
    client = TransformersChatClient(tiny_model_path())
    before, _ = await client.complete(_req(temperature=0.0, max_tokens=8))
    good_part = {"model.layers.0.mlp.up_proj.weight": torch.zeros(384, 128)}
    with pytest.raises(error, match=match):
        client.sync_weights({**good_part, **bad})
    after, _ = await client.complete(_req(temperature=0.0, max_tokens=8))
    assert after.completion_logprobs == before.completion_logprobs
    assert client.policy_version == 0


async def test_bad_requests_raise_clear_errors(client):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        await client.complete(_req(max_tokens=5000))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await client.complete(
            ChatCompletionRequest(
                model="t", messages=[{"role": "user", "content": "x"}], prompt_token_ids=[10**6]
            )
        )


async def test_tokenizer_without_chat_template_is_a_clear_error():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    tokenizer.chat_template = None
    client = TransformersChatClient(tiny_model_path(), tokenizer)
    with pytest.raises(ValueError, match="has no chat_template"):
        await client.complete(_req())
