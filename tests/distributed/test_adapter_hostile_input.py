"""A hostile or careless client of Ludic's server's adapter routes (a real subprocess on 127.0.0.1, folding).

Each refusal names what was wrong, and changes nothing: the served log-probs and version stay as they were."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save
from transformers import AutoModelForCausalLM

from ludic.distributed import SyncProbe, VLLMLoraPublisher, adapter_payload
from ludic.inference import VLLMChatClient
from ludic.inference.http_client import RequestRefused
from ludic.inference.weight_sync.adapter_config import ADAPTER_METADATA_KEY, AdapterConfig, lora_names
from ludic.testing.lora import trained_lora_model
from ludic.testing.server_process import running_server

from .test_shared_memory_ownership import post, write_call

pytestmark = pytest.mark.integration
PROBE = [5, 6, 7, 8, 9, 10, 11, 12, 13]
Q0 = "model.layers.0.self_attn.q_proj"  # a [128, 128] linear layer of the tiny model
OCTET = {"Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def url(dirs: tuple[Path, Path]) -> Iterator[str]:
    """Folding (the default); a 1 s transfer timeout, so an abandoned update can be taken over in a test."""
    with running_server(dirs[0], ["--transfer-timeout", "1"]) as base:
        assert post(base, "/init_weight_transfer_engine", {"init_info": {"backend": "shm"}}).status_code == 200
        yield base


@pytest.fixture(scope="module")
def fingerprint(dirs: tuple[Path, Path]) -> str:
    return adapter_payload(trained_lora_model(dirs[0], ["q_proj"], seed=0)).config.base_fingerprint


def served(url: str) -> tuple[list[float], int]:
    body = {"prompt": PROBE, "max_tokens": 4, "temperature": 0.0, "logprobs": 0}
    reply = httpx.post(url + "/v1/completions", json=body, timeout=30).json()
    return reply["choices"][0]["logprobs"]["token_logprobs"], reply["policy_version"]


def adapter_blob(config: AdapterConfig, a: torch.Tensor, b: torch.Tensor) -> bytes:
    """What a client uploads: one layer's A and B, the config in the safetensors metadata."""
    names = lora_names(config.target_modules[0])
    return save(dict(zip(names, (a, b), strict=True)), metadata={ADAPTER_METADATA_KEY: json.dumps(config.to_json())})


def one_layer(fingerprint: str, *, rank: int = 4, scaling: float = 2.0) -> AdapterConfig:
    return AdapterConfig(rank=rank, alpha=scaling * rank, target_modules=(Q0,), scalings=(scaling,),
                         base_fingerprint=fingerprint)  # fmt: skip


def test_an_adapter_larger_than_the_model_is_refused_before_a_byte_is_sent(url, dirs, fingerprint):
    """Rank 10**9 on one [128, 128] layer: over shared memory or a collective the server allocated A and B
    (1 TB) as their bytes arrived. Over the blob, a rank that makes the adapter outweigh the model."""
    before = served(url)
    huge = post(url, "/start_weight_update", {"adapter": one_layer(fingerprint, rank=10**9).to_json()})
    assert huge.status_code == 400, huge.text
    assert "adapter of rank 1000000000 on 1 layers holds 256000000000 values, more than" in huge.text
    model_values = sum(t.numel() for t in AutoModelForCausalLM.from_pretrained(dirs[0]).state_dict().values())
    rank = model_values // 256 + 1
    blob = adapter_blob(one_layer(fingerprint, rank=rank), torch.zeros(rank, 128), torch.zeros(128, rank))
    refused = httpx.post(url + "/ludic/update_weights_blob", content=blob, headers=OCTET, timeout=30)
    assert refused.status_code == 400 and f"adapter of rank {rank} on 1 layers" in refused.text
    assert served(url) == before


@pytest.mark.parametrize("a_value, scaling, message", [
    (1e20, 2.0, "NaN or inf weights"),  # A, B and the scaling finite, their product not: 4 * 1e40 * 2
    (1e-3, 1e300, "out of the served float32's range"),  # inf once the fold (or forward) computes in fp32
])  # fmt: skip
def test_an_adapter_whose_served_weights_would_overflow_is_refused(url, fingerprint, a_value, scaling, message):
    before = served(url)
    blob = adapter_blob(one_layer(fingerprint, scaling=scaling), torch.full((4, 128), a_value),
                        torch.full((128, 4), a_value))  # fmt: skip
    refused = httpx.post(url + f"/ludic/update_weights_blob?version={before[1] + 1}", content=blob, headers=OCTET,
                         timeout=30)  # fmt: skip
    assert refused.status_code == 400 and message in refused.json()["error"]["message"], refused.text
    after = served(url)
    assert after == before  # the old model's log-probs (finite), at the old version


def test_a_refused_adapter_start_does_not_disturb_the_update_it_would_have_taken_over(url, dirs):
    """Publisher 1's full update goes quiet past the timeout; publisher 2 starts an adapter of another base
    (refused). Before, that refusal had already emptied publisher 1's staging: its later calls and finish
    then served only its second half, on top of the old first half (two models mixed)."""
    client = VLLMChatClient(base_url=url)
    new = AutoModelForCausalLM.from_pretrained(dirs[1]).eval()
    tensors = [(k, v) for k, v in new.state_dict().items() if k != "lm_head.weight"]  # tied to the embedding
    version = served(url)[1]
    first = post(url, "/start_weight_update", {}).json()["update_id"]
    call, _ = write_call(url, first, dict(tensors[: len(tensors) // 2]))
    assert post(url, "/update_weights", {"update_info": call, "update_id": first}).status_code == 200
    time.sleep(1.2)  # the server's transfer timeout: publisher 1 may now be taken over
    other = one_layer("0" * 32).to_json()
    refused = post(url, "/start_weight_update", {"adapter": other})
    assert refused.status_code == 400 and "base" in refused.json()["error"]["message"]
    call, _ = write_call(url, first, dict(tensors[len(tensors) // 2 :]))
    assert post(url, "/update_weights", {"update_info": call, "update_id": first}).status_code == 200
    done = post(url, "/finish_weight_update", {"weight_version": str(version + 1), "update_id": first})
    assert done.status_code == 200, done.text
    assert SyncProbe(new, client, PROBE, tolerance=1e-4).check(version + 1) < 1e-4  # all of it, nothing mixed
    base = AutoModelForCausalLM.from_pretrained(dirs[0]).eval()  # back to the base the other tests expect
    VLLMChatClient(base_url=url, enable_weight_updates=True).sync_weights(
        {k: v for k, v in base.state_dict().items() if k != "lm_head.weight"}, version=version + 2)


def test_publishing_the_same_version_again_replaces_its_folder(url, dirs, tmp_path):
    """A restarted trainer publishes the versions its first run wrote folders for (``keep`` kept them):
    before, the rename onto the existing folder failed (directory not empty) and the run stopped."""
    client = VLLMChatClient(base_url=url, enable_weight_updates=True)
    version = served(url)[1] + 1
    VLLMLoraPublisher(client, tmp_path, lora_name="p").publish(
        adapter_payload(trained_lora_model(dirs[0], ["q_proj"], seed=1)), version=version)
    restarted = trained_lora_model(dirs[0], ["q_proj"], seed=2)
    VLLMLoraPublisher(client, tmp_path, lora_name="p").publish(adapter_payload(restarted), version=version)
    assert SyncProbe(restarted, client, PROBE, tolerance=1e-4).check(version) < 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"p-v{version}"]  # no temporary folder left behind
    client.unload_lora_adapter_sync("p")


def test_unloading_another_name_is_a_404_and_the_adapter_keeps_serving(url, dirs, tmp_path):
    """vLLM's meaning: unload the adapter of that name. Before, any name unloaded whatever was served."""
    client = VLLMChatClient(base_url=url, enable_weight_updates=True)
    model = trained_lora_model(dirs[0], ["q_proj"], seed=3)
    version = served(url)[1] + 1
    VLLMLoraPublisher(client, tmp_path, lora_name="policy-a").publish(adapter_payload(model), version=version)
    wrong = post(url, "/v1/unload_lora_adapter", {"lora_name": "policy-b"})
    assert wrong.status_code == 404 and "'policy-b'" in wrong.text and "serving 'policy-a'" in wrong.text
    assert SyncProbe(model, client, PROBE, tolerance=1e-4).check(version) < 1e-4
    assert post(url, "/v1/unload_lora_adapter", {"lora_name": "policy-a"}).status_code == 200
    assert post(url, "/v1/unload_lora_adapter", {"lora_name": "policy-a"}).status_code == 404


def test_a_refused_folder_publish_keeps_the_old_adapter_and_leaves_no_folder(url, dirs, tmp_path):
    """The server refuses an adapter of another base: the one before keeps serving, and the refused folder is
    removed (before, it stayed in adapter_dir, tracked by nothing, never deleted)."""
    client = VLLMChatClient(base_url=url, enable_weight_updates=True)
    model = trained_lora_model(dirs[0], ["q_proj"], seed=4)
    version = served(url)[1] + 1
    publisher = VLLMLoraPublisher(client, tmp_path, lora_name="p", keep=1)
    publisher.publish(adapter_payload(model), version=version)
    with pytest.raises(RequestRefused, match="base"):
        publisher.publish(adapter_payload(trained_lora_model(dirs[1], ["q_proj"], seed=4)), version=version + 1)
    assert SyncProbe(model, client, PROBE, tolerance=1e-4).check(version) < 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"p-v{version}"]
    client.unload_lora_adapter_sync("p")
