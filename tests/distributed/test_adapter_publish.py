"""LoRA adapter publishing against Ludic's server in a real subprocess: blob, gloo, shm and vLLM's LoRA routes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from peft import LoraConfig
from transformers import AutoModelForCausalLM

from ludic.distributed import (
    BroadcastPolicyPublisher,
    ClientPublisher,
    PublishError,
    SyncCheckError,
    SyncProbe,
    VLLMLoraPublisher,
    adapter_payload,
    create_vllm_publisher,
)  # fmt: skip
from ludic.inference import ChatCompletionRequest, SamplingConfig, VLLMChatClient
from ludic.inference.http_client import RequestRefused
from ludic.inference.weight_sync.adapter_config import AdapterPayload
from ludic.testing import build_tiny_model
from ludic.testing.lora import trained_lora_model
from ludic.testing.server_process import running_server
from ludic.training._lora import merged_state_dict

pytestmark = pytest.mark.integration
PROBE = [5, 6, 7, 8, 9, 10, 11, 12, 13]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lora")
    return build_tiny_model(root / "a", seed=0), build_tiny_model(root / "b", seed=7)


@pytest.fixture(scope="module", params=["fold", "unmerged"])
def server(dirs: tuple[Path, Path], request: pytest.FixtureRequest) -> Iterator[str]:
    """The server in each ``--adapter-serving`` mode: every test below holds in both."""
    with running_server(dirs[0], ["--transfer-timeout", "5", "--adapter-serving", request.param]) as url:
        yield url


def lora_model(model_dir: Path, seed: int) -> torch.nn.Module:
    """A peft model on ``model_dir`` whose adapters are non-zero (as after training)."""
    return trained_lora_model(model_dir, ["q_proj", "v_proj", "up_proj"], seed=seed)


def publishers(client: VLLMChatClient, tmp: Path) -> dict[str, object]:
    return {
        "blob": ClientPublisher(client, lora="adapter"),
        "gloo": BroadcastPolicyPublisher(client, lora="adapter", timeout_s=20, bucket_bytes=16 << 10),
        "shm": BroadcastPolicyPublisher(client, backend="shm", lora="adapter", timeout_s=20),
        "vllm-lora-routes": VLLMLoraPublisher(client, tmp / "adapters", lora_name="policy"),
    }


def test_an_adapter_publish_serves_exactly_the_trained_policy_over_every_transport(server, dirs, tmp_path):
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    version = 100
    for i, (kind, publisher) in enumerate(publishers(client, tmp_path).items()):
        model = lora_model(dirs[0], seed=i)
        probe = SyncProbe(model, client, PROBE, tolerance=1e-4)
        with pytest.raises(SyncCheckError):
            probe.check()  # before the publish the server does not serve this adapter
        payload = adapter_payload(model)
        publisher.publish(payload, version=version + i)
        assert probe.check(version + i) < 1e-4, kind  # server log-probs == the peft model's, at the new version
        full = sum(t.numel() * t.element_size() for t in merged_state_dict(model).values())
        assert publisher.last_stats["publish_bytes"] < 0.05 * full, kind


def test_a_bad_adapter_is_refused_and_the_old_weights_keep_serving(server, dirs):
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    model = lora_model(dirs[0], seed=11)
    gloo = BroadcastPolicyPublisher(client, lora="adapter", timeout_s=20)
    gloo.publish(adapter_payload(model), version=200)
    probe = SyncProbe(model, client, PROBE, tolerance=1e-4)
    good = adapter_payload(model)
    name = next(n for n in good if n.endswith("lora_B.weight"))
    nan = AdapterPayload({**good, name: torch.full_like(good[name], float("nan"))}, good.config)
    wide = AdapterPayload({**good, name: torch.zeros(good[name].shape[0], 5)}, good.config)
    other_base = adapter_payload(lora_model(dirs[1], seed=11))  # same shapes, another base model
    huge = AdapterPayload({**good, name: torch.full_like(good[name], 1e300, dtype=torch.float64)}, good.config)
    cases = [(nan, "NaN"), (wide, "shape"), (other_base, "base"), (huge, "NaN or inf")]
    for bad, message in cases:
        for publisher in (gloo, ClientPublisher(client, lora="adapter")):
            with pytest.raises((PublishError, RequestRefused), match=message):
                publisher.publish(bad, version=300)
            assert probe.check(200) < 1e-4  # still the good adapter, still version 200
    gloo.close()


def test_a_full_publish_after_an_adapter_replaces_the_base_and_old_adapters_no_longer_fit(server, dirs):
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    publisher = BroadcastPolicyPublisher(client, lora="adapter", timeout_s=20)
    adapted = lora_model(dirs[0], seed=3)
    publisher.publish(adapter_payload(adapted), version=400)
    other = AutoModelForCausalLM.from_pretrained(dirs[1]).eval()
    publisher.publish(other.state_dict(), version=401)  # plain weights: a full update of every layer
    assert SyncProbe(other, client, PROBE, tolerance=1e-4).check(401) < 1e-4
    with pytest.raises(PublishError, match="base"):  # the adapter was trained on the old base
        publisher.publish(adapter_payload(adapted), version=402)
    base = AutoModelForCausalLM.from_pretrained(dirs[0]).eval()
    publisher.publish(base.state_dict(), version=403)  # back to the first base: its adapters fit again
    publisher.publish(adapter_payload(adapted), version=404)
    assert SyncProbe(adapted, client, PROBE, tolerance=1e-4).check(404) < 1e-4
    publisher.close()


@pytest.mark.slow
def test_the_sync_probe_catches_an_adapter_publish_that_did_not_apply(dirs):
    model = lora_model(dirs[0], seed=5)
    with running_server(dirs[0], ["--drop-weight-updates"]) as url:
        client = VLLMChatClient(base_url=url, enable_weight_updates=True)
        probe = SyncProbe(model, client, PROBE)
        publisher = create_vllm_publisher(client, rank0_only=False, lora="adapter", probe=probe, timeout_s=20)
        with pytest.raises(SyncCheckError, match="did not"):
            publisher.publish(adapter_payload(model), version=1)


def test_unload_serves_the_base_again(server, dirs, tmp_path):
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    base = AutoModelForCausalLM.from_pretrained(dirs[0]).eval()
    BroadcastPolicyPublisher(client, timeout_s=20).publish(base.state_dict(), version=500)
    VLLMLoraPublisher(client, tmp_path, lora_name="p").publish(adapter_payload(lora_model(dirs[0], 9)), version=501)
    client.unload_lora_adapter_sync("p")
    assert SyncProbe(base, client, PROBE, tolerance=1e-4).check() < 1e-4
    with pytest.raises(RequestRefused, match="404"):
        client.unload_lora_adapter_sync("p")


def test_the_payload_follows_a_new_adapter_with_other_targets_on_the_same_model(dirs):
    """The LoRA layers are looked up once per model and set of adapter configs: adding an adapter on other
    layers (and switching to it) is seen by the next payload."""
    model = lora_model(dirs[0], seed=1)
    first = adapter_payload(model)
    assert sorted({n.split(".")[-3] for n in first}) == ["q_proj", "up_proj", "v_proj"]
    model.add_adapter("second", LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["k_proj"]))
    model.set_adapter("second")
    second = adapter_payload(model)
    assert second.config.name == "second" and second.config.rank == 2
    assert sorted({n.split(".")[-3] for n in second}) == ["k_proj"] and len(second) == 2 * 4  # 4 layers, A and B


def test_sampled_tokens_logprobs_equal_the_peft_models_after_an_adapter_publish(server, dirs):
    """The server's decoding path (the lean decoder), not only the probe's prompt scoring (its transformers
    forward): every sampled token's log-prob is the peft model's, in both serving modes."""
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    model = lora_model(dirs[0], seed=21)
    ClientPublisher(client, lora="adapter").publish(adapter_payload(model), version=600)

    async def sample() -> tuple[list[int], list[float]]:
        request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "-"}], prompt_token_ids=PROBE,
                                        sampling=SamplingConfig(temperature=1.0, max_tokens=16, seed=1))  # fmt: skip
        response, _ = await client.complete(request)
        await client.aclose()
        return response.completion_token_ids, response.completion_logprobs

    completion, served = asyncio.run(sample())
    base = AutoModelForCausalLM.from_pretrained(dirs[0]).eval()
    with torch.no_grad():
        expected, unadapted = (torch.log_softmax(m(torch.tensor([PROBE + completion])).logits.float(), -1)[0]
                               for m in (model, base))  # fmt: skip
    rows = [len(PROBE) - 1 + i for i in range(len(completion))]
    assert len(completion) == 16 and served == pytest.approx(expected[rows, completion].tolist(), abs=1e-4)
    assert (expected[rows, completion] - unadapted[rows, completion]).abs().max() > 1e-3  # the adapter matters
