"""The HTTP inference server in a real subprocess on loopback, driven by VLLMChatClient."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.distributed import create_vllm_publisher
from ludic.inference import ChatCompletionRequest, SamplingConfig, VLLMChatClient
from ludic.testing import build_tiny_model
from ludic.testing.run_config import tiny_run_toml

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "ludic.inference.server", str(model_dir), "--port", str(port)]
    # The log goes to a file, not a pipe nobody drains: a full pipe would block the server mid-request.
    log_path = model_dir.parent / f"server-{port}.log"
    log = open(log_path, "wb")  # noqa: SIM115 (closed at teardown)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as reply:
                assert json.loads(reply.read())["status"] == "ok"
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log.close()
                raise RuntimeError(f"server did not start: {log_path.read_text()[-2000:]}") from None
            time.sleep(0.2)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        raise
    finally:
        log.close()


def request(content: str = "hello", prompt_ids: list[int] | None = None, **sampling) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="tiny",
        messages=[{"role": "user", "content": content}],
        sampling=SamplingConfig(**sampling),
        prompt_token_ids=prompt_ids,
    )


def forward_logps(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        logps = torch.log_softmax(model(torch.tensor([prompt + completion])).logits.float(), dim=-1)
    return [float(logps[0, len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


async def test_completions_carry_exact_ids_and_logprobs_of_the_served_model(server, model_dir):
    from transformers import AutoTokenizer

    client = VLLMChatClient(base_url=server)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    response, info = await client.complete(request("say hi", max_tokens=12, seed=3))
    want_prompt = tok.apply_chat_template(
        [{"role": "user", "content": "say hi"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert response.prompt_token_ids == list(want_prompt)
    text_ids = [t for t in response.completion_token_ids if t != tok.eos_token_id]
    assert tok.decode(text_ids) == response.text
    assert forward_logps(model, response.prompt_token_ids, response.completion_token_ids) == pytest.approx(
        response.completion_logprobs, abs=1e-4
    )
    assert info["policy_version"] == response.policy_version == 0
    token_in, _ = await client.complete(request("ignored", prompt_ids=[5, 6, 7], max_tokens=4, seed=1))
    assert token_in.prompt_token_ids == [5, 6, 7]
    await client.aclose()


async def test_same_seed_same_completion_and_concurrent_requests_are_all_answered(server):
    client = VLLMChatClient(base_url=server)
    results = await asyncio.gather(
        *[client.complete(request(f"q{i % 4}", max_tokens=8, seed=i)) for i in range(16)]
    )
    again, _ = await client.complete(request("q1", max_tokens=8, seed=5))
    assert len(results) == 16
    assert again.completion_token_ids == results[5][0].completion_token_ids
    await client.aclose()


async def test_bad_sampling_field_is_a_400_naming_it(server):
    client = VLLMChatClient(base_url=server)
    bad = VLLMChatClient.request_body(request("x", max_tokens=4)) | {"top_p": 1.5}
    with pytest.raises(ValueError, match="top_p"):
        await client._post_json("/v1/chat/completions", bad)
    with pytest.raises(ValueError, match="n=2"):
        await client._post_json("/v1/chat/completions", bad | {"top_p": 1.0, "n": 2})
    await client.aclose()


async def test_weight_updates_change_the_served_policy_all_or_nothing(server, model_dir, tmp_path):
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    probe = request("probe", max_tokens=6, temperature=0.0)
    before, _ = await client.complete(probe)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "other", seed=7))
    state = other.state_dict()

    wrong_shape = dict(state) | {"lm_head.weight": torch.zeros(3, 3)}
    with pytest.raises(ValueError, match=r"lm_head\.weight"):
        client.sync_weights(wrong_shape, version=5)
    with pytest.raises(ValueError, match="nope"):
        client.sync_weights({"nope": torch.zeros(1)}, version=5)
    nan = dict(state) | {"model.norm.weight": torch.full_like(state["model.norm.weight"], float("nan"))}
    with pytest.raises(ValueError):
        client.sync_weights(nan, version=5)
    unchanged, _ = await client.complete(probe)
    assert unchanged.completion_logprobs == pytest.approx(before.completion_logprobs, abs=1e-6)
    assert await client.get_policy_version() == 0

    publisher = create_vllm_publisher(client, rank0_only=False)
    publisher.publish(state, version=3)
    after, _ = await client.complete(probe)
    assert await client.get_policy_version() == 3 and after.policy_version == 3
    assert forward_logps(other, after.prompt_token_ids, after.completion_token_ids) == pytest.approx(
        after.completion_logprobs, abs=1e-4
    )
    await client.aclose()


async def test_a_blob_uploaded_in_small_pieces_arrives_whole(server, tmp_path, monkeypatch):
    """``sync_weights`` streams the blob as views of at most ``UPLOAD_PIECE_BYTES`` (a ``bytes`` body is
    re-copied by httpcore after every socket send: quadratic); set small here, the tiny model's blob goes in
    hundreds of pieces, and the server serves exactly the published weights. Runs after the test above
    (version 3), in this module's order."""
    import ludic.inference.vllm._weights as blob_upload

    pieces: list[int] = []

    def counted(blob: bytes, size: int | None = None):
        for piece in real_pieces(blob, size):
            pieces.append(len(piece))
            yield piece

    real_pieces = blob_upload.in_pieces
    monkeypatch.setattr(blob_upload, "UPLOAD_PIECE_BYTES", 4096)
    monkeypatch.setattr(blob_upload, "in_pieces", counted)
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "other", seed=11))
    client.sync_weights(other.state_dict(), version=9)
    assert len(pieces) > 100 and max(pieces) == 4096  # the whole blob, in 4 KiB views
    served, _ = await client.complete(request("probe", max_tokens=6, temperature=0.0))
    assert served.policy_version == 9
    assert forward_logps(other, served.prompt_token_ids, served.completion_token_ids) == pytest.approx(
        served.completion_logprobs, abs=1e-4
    )
    await client.aclose()


async def test_a_tied_tensor_is_uploaded_once_and_served_under_both_names(server, tmp_path, monkeypatch):
    """A tied model's own ``state_dict()`` (``lm_head.weight`` is the embedding) sent straight to
    ``sync_weights``: the embedding's bytes go once, its other name rides in the metadata, and the server
    serves exactly those weights. Runs after the pieces test (version 9)."""
    import ludic.inference.vllm._weights as blob_upload

    sent: list[int] = []

    def counted(blob: bytes, size: int | None = None):
        sent.append(len(blob))
        yield from real_pieces(blob, size)

    real_pieces = blob_upload.in_pieces
    monkeypatch.setattr(blob_upload, "in_pieces", counted)
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "tied", seed=13))
    state = other.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()  # tied
    every_name = sum(t.numel() * t.element_size() for t in state.values())
    embedding = state["lm_head.weight"].numel() * state["lm_head.weight"].element_size()
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    client.sync_weights(state, version=11)
    assert every_name - embedding < sent[0] < every_name - embedding + 65536  # once, plus the header
    served, _ = await client.complete(request("probe", max_tokens=6, temperature=0.0))
    assert served.policy_version == 11
    assert forward_logps(other, served.prompt_token_ids, served.completion_token_ids) == pytest.approx(
        served.completion_logprobs, abs=1e-4
    )
    await client.aclose()


@pytest.mark.parametrize(
    "aliases, named",
    [({"lm_head.weight": "model.nope.weight"}, "model.nope.weight"),
     ({"model.norm.weight": "model.norm.weight"}, "model.norm.weight"),
     ("not json", "ludic.aliases"),
     ('["a", "b"]', "ludic.aliases")],
)  # fmt: skip
async def test_a_blob_with_bad_tied_names_is_refused_and_changes_nothing(server, aliases, named):
    from safetensors.torch import save

    from ludic.inference.weight_sync.tied_names import ALIASES_METADATA_KEY

    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    version = await client.get_policy_version()
    raw = aliases if isinstance(aliases, str) else json.dumps(aliases)
    blob = save({"model.norm.weight": torch.ones(128)}, metadata={ALIASES_METADATA_KEY: raw})
    post = urllib.request.Request(server + "/ludic/update_weights_blob", data=blob, method="POST",
                                  headers={"Content-Type": "application/octet-stream"})  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(post, timeout=30)
    assert refused.value.code == 400 and named in refused.value.read().decode()
    assert await client.get_policy_version() == version
    await client.aclose()


def test_in_pieces_views_the_blob_without_copying_it() -> None:
    from ludic.inference.vllm._weights import in_pieces

    blob = bytes(range(256)) * 40  # 10,240 bytes: two whole pieces of 4,096 and the rest
    pieces = list(in_pieces(blob, 4096))
    assert [len(p) for p in pieces] == [4096, 4096, 2048]
    assert all(isinstance(p, memoryview) and p.obj is blob for p in pieces)  # views onto the blob itself
    assert b"".join(pieces) == blob and list(in_pieces(b"", 4096)) == []


def test_weight_updates_need_to_be_enabled(server):
    with pytest.raises(RuntimeError, match="enable_weight_updates"):
        VLLMChatClient(base_url=server).sync_weights({}, version=1)


def test_a_response_without_token_ids_is_a_clear_error():
    plain_openai = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}
    with pytest.raises(RuntimeError, match="return_token_ids"):
        VLLMChatClient.parse_response(plain_openai)


def test_ludic_train_with_a_server_backend(model_dir, tmp_path):
    """A fresh server: the run publishes versions 1 and 2, and versions never go backwards."""
    from ludic.testing.server_process import running_server

    with running_server(model_dir) as server:
        _train_against(server, model_dir, tmp_path)


def _train_against(server: str, model_dir, tmp_path) -> None:
    from ludic.cli import main

    config = tmp_path / "run.toml"
    config.write_text(
        tiny_run_toml(model_dir, steps=2, tables=f"""
[inference]
backend = "server"
server_url = "{server}"
[trainer]
lr = 1e-4
max_seq_len = 128
micro_token_budget = 1024
[logging]
output_dir = "{tmp_path / "out"}"
rich = false
""")
    )
    assert main(["train", str(config)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    with urllib.request.urlopen(server + "/policy_version") as reply:  # the trainer published each step
        assert json.loads(reply.read())["policy_version"] == 2
