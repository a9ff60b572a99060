"""vLLM's token-in/token-out routes, auth and limits, against Ludic's server in a real subprocess."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.inference import ChatCompletionRequest, SamplingConfig, VLLMChatClient
from ludic.inference.http_client import RequestRefused
from ludic.testing.server_process import running_server

pytestmark = pytest.mark.integration
KEY = "s3cret"


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[str]:
    with running_server(model_dir, ["--api-key", KEY, "--max-body-mb", "0.05", "--max-pending", "2"]) as url:
        yield url


def ids_request(prompt: list[int], **sampling) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="tiny", messages=[{"role": "user", "content": "-"}], sampling=SamplingConfig(**sampling),
        prompt_token_ids=prompt,
    )  # fmt: skip


def forward_logps(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        logps = torch.log_softmax(model(torch.tensor([prompt + completion])).logits.float(), dim=-1)
    return [float(logps[0, len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


@pytest.mark.parametrize("route", ["completions", "generate"])
async def test_token_ids_in_exact_ids_logprobs_and_version_out(server, model_dir, route):
    client = VLLMChatClient(base_url=server, api_key=KEY, route=route)
    response, info = await client.complete(ids_request([5, 6, 7, 8], max_tokens=6, seed=2))
    await client.aclose()
    assert response.prompt_token_ids == [5, 6, 7, 8]
    assert len(response.completion_token_ids) == len(response.completion_logprobs) >= 1
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert forward_logps(model, [5, 6, 7, 8], response.completion_token_ids) == pytest.approx(
        response.completion_logprobs, abs=1e-4
    )
    assert response.policy_version == info["policy_version"] == 0


def test_completions_payload_has_vllms_field_names(server):
    body = VLLMChatClient.completions_body(ids_request([5, 6], max_tokens=3, seed=1))
    assert body["prompt"] == [5, 6] and body["return_token_ids"] is True and body["logprobs"] == 0
    assert body["return_weight_versions"] is True
    gen = VLLMChatClient.generate_body(ids_request([5, 6], max_tokens=3))
    assert gen["token_ids"] == [5, 6] and gen["sampling_params"]["max_tokens"] == 3
    reply = httpx.post(server + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}).json()
    choice = reply["choices"][0]
    assert choice["prompt_token_ids"] == [5, 6]
    assert choice["weight_versions"] == [{"version": "0", "start": 0, "end": len(choice["token_ids"])}]
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])


def test_state_changing_routes_need_the_bearer_token(server):
    assert httpx.get(server + "/health").status_code == 200
    for path in ("/v1/completions", "/ludic/update_weights_blob", "/start_weight_update", "/update_weights",
                 "/init_weight_transfer_engine", "/ludic/reserve_weight_buffer"):
        reply = httpx.post(server + path, json={})
        assert reply.status_code == 401, path
        assert "bearer token" in reply.json()["error"]["message"]
    wrong = httpx.post(server + "/start_weight_update", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401


async def test_bad_requests_are_4xx_with_the_reason_and_the_client_reports_them(server):
    client = VLLMChatClient(base_url=server, api_key=KEY)
    with pytest.raises(RequestRefused, match="prompt must be a list of token ids") as info:
        await client.post_json("/v1/completions", {"prompt": "text", "max_tokens": 2})
    assert info.value.status == 400
    with pytest.raises(RequestRefused, match="outside the vocabulary"):
        await client.complete(ids_request([5, 10**6], max_tokens=2))
    with pytest.raises(RequestRefused, match="max_position_embeddings"):
        await client.complete(ids_request([5] * 10, max_tokens=10**6))
    with pytest.raises(RequestRefused, match="top_p"):
        await client.post_json("/v1/completions", {"prompt": [5], "top_p": 1.5})
    with pytest.raises(RequestRefused, match="413"):
        await client.post_json("/v1/completions", {"prompt": [5] * 40_000})
    await client.aclose()


async def test_a_full_queue_is_a_503_with_the_reason_and_the_rest_complete(server):
    client = VLLMChatClient(base_url=server, api_key=KEY, retries=0)
    results = await asyncio.gather(
        *[client.complete(ids_request([5, 6, 7], max_tokens=24, seed=i)) for i in range(12)], return_exceptions=True
    )
    await client.aclose()
    refused = [r for r in results if isinstance(r, Exception)]
    assert refused and all("HTTP 503" in str(r) and "max_pending=2" in str(r) for r in refused)
    assert any(not isinstance(r, Exception) for r in results)


@pytest.mark.slow
async def test_a_killed_server_fails_the_call_clearly_and_the_client_works_once_it_is_back(model_dir):
    from ludic.inference.http_client import ServerError
    from ludic.inference.weight_sync.process_group import free_port
    from ludic.testing.server_process import start_server, stop_server

    port = free_port()
    proc, url = start_server(model_dir, port=port)
    client = VLLMChatClient(base_url=url, retries=2, backoff_s=0.1)
    try:
        first, _ = await client.complete(ids_request([5, 6], max_tokens=2, seed=0))
        proc.kill()
        proc.wait()
        with pytest.raises(ServerError, match="could not reach the server after 3 attempt"):
            await client.complete(ids_request([5, 6], max_tokens=2, seed=0))
        proc, _ = start_server(model_dir, port=port)
        again, _ = await client.complete(ids_request([5, 6], max_tokens=2, seed=0))
        assert again.completion_token_ids == first.completion_token_ids
    finally:
        stop_server(proc)
        await client.aclose()
