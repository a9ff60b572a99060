"""The blob and adapter-folder routes of Ludic's server (a real subprocess) respect the update owner and bound
what they serve (issue 37): during another publisher's shared-memory update both answer 409 and change nothing;
an adapter whose scaling is finite but huge, or whose folder's version is " 8", is a 400 naming it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from safetensors import safe_open
from safetensors.torch import save, save_file

from ludic.distributed import adapter_payload
from ludic.inference.weight_sync.adapter_config import ADAPTER_METADATA_KEY, AdapterPayload
from ludic.inference.weight_sync.adapter_files import VERSION_METADATA_KEY, WEIGHTS_FILE, write_adapter_folder
from ludic.testing.lora import trained_lora_model
from ludic.testing.server_process import running_server

pytestmark = pytest.mark.integration
OCTET = {"Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def url(dirs: tuple[Path, Path]) -> Iterator[str]:
    with running_server(dirs[0], ["--transfer-timeout", "30"]) as base:
        assert httpx.post(base + "/init_weight_transfer_engine", json={"init_info": {"backend": "shm"}}).status_code == 200
        yield base


@pytest.fixture(scope="module")
def adapter(dirs: tuple[Path, Path]) -> AdapterPayload:
    return adapter_payload(trained_lora_model(dirs[0], ["q_proj"], seed=1))


def blob(payload: AdapterPayload) -> bytes:
    tensors = {k: v.contiguous() for k, v in payload.items()}
    return save(tensors, metadata={ADAPTER_METADATA_KEY: json.dumps(payload.config.to_json())})


def version(url: str) -> int:
    return httpx.get(url + "/policy_version").json()["policy_version"]


def message(reply: httpx.Response) -> str:
    try:
        return str(reply.json()["error"]["message"])
    except ValueError:
        return reply.text


def test_blob_and_adapter_routes_get_409_during_another_publishers_update(url, adapter, tmp_path):
    folder = write_adapter_folder(adapter, tmp_path / "a", version=version(url) + 5)
    before = version(url)
    update_id = httpx.post(url + "/start_weight_update", json={}).json()["update_id"]
    try:
        put = httpx.post(url + f"/ludic/update_weights_blob?version={before + 1}", content=blob(adapter), headers=OCTET)
        assert put.status_code == 409 and update_id in message(put), put.text
        load = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(folder)})
        assert load.status_code == 409 and update_id in message(load), load.text
        unload = httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "x"})
        assert unload.status_code == 409 and update_id in message(unload), unload.text
        assert version(url) == before
    finally:
        assert httpx.post(url + "/ludic/abort_weight_update", json={"update_id": update_id}).status_code == 200
    put = httpx.post(url + f"/ludic/update_weights_blob?version={before + 1}", content=blob(adapter), headers=OCTET)
    assert put.status_code == 200 and version(url) == before + 1, put.text
    load = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(folder)})
    assert load.status_code == 200 and version(url) == before + 5, load.text
    assert httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "x"}).status_code == 200


def test_a_finite_but_huge_scaling_is_a_400_naming_it(url, adapter):
    huge = AdapterPayload(dict(adapter), dataclasses.replace(adapter.config, scalings=(1e30,) * len(adapter.config.scalings)))
    before = version(url)
    put = httpx.post(url + "/ludic/update_weights_blob", content=blob(huge), headers=OCTET)
    assert put.status_code == 400 and "adapter scaling 1e+30 of 'model.layers.0.self_attn.q_proj'" in message(put)
    assert version(url) == before


@pytest.mark.parametrize("written", [" 8", "8 ", "+8", "8_0", "\u0668"])
def test_an_adapter_folders_version_must_be_plain_digits(url, adapter, tmp_path, written):
    folder = write_adapter_folder(adapter, tmp_path / "v", version=8)
    path = folder / WEIGHTS_FILE
    with safe_open(str(path), framework="pt") as f:
        metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    save_file(tensors, str(path), metadata={**metadata, VERSION_METADATA_KEY: written})
    before = version(url)
    load = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "v", "lora_path": str(folder)})
    assert load.status_code == 400 and "is not a decimal integer" in message(load), load.text
    assert version(url) == before
