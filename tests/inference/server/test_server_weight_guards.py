"""Ludic's server without ``--api-key`` (a real subprocess): what a web page could make a browser send
(cross-origin, or a "simple" text/plain / form / untyped body) is refused, and weight versions are
int64s that never go backwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import save
from transformers import AutoModelForCausalLM

from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.testing import tiny_model_path
from ludic.testing.server_process import running_server

pytestmark = pytest.mark.integration
OCTET = {"Content-Type": "application/octet-stream"}
EVIL = "http://evil.example"


@pytest.fixture(scope="module")
def server(dirs: tuple[Path, Path]) -> Iterator[str]:
    with running_server(dirs[0]) as url:
        yield url


@pytest.fixture(scope="module")
def blob(dirs: tuple[Path, Path]) -> bytes:
    state = AutoModelForCausalLM.from_pretrained(dirs[1]).state_dict()
    return save({k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"})  # tied to the embedding


def served(url: str) -> tuple[list[float], int]:
    body = {"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0.0, "logprobs": 0}
    reply = httpx.post(url + "/v1/completions", json=body, timeout=30).json()
    return reply["choices"][0]["logprobs"]["token_logprobs"], reply["policy_version"]


def message(reply: httpx.Response) -> str:
    return reply.json()["error"]["message"]


def test_what_a_browser_can_send_cross_origin_without_preflight_is_refused(server, blob):
    before = served(server)
    blob_url = server + "/ludic/update_weights_blob?version=7"
    plain = httpx.post(blob_url, content=blob, headers={"Content-Type": "text/plain"})
    assert plain.status_code == 415 and "application/octet-stream" in message(plain)
    untyped = httpx.post(blob_url, content=blob)  # a Blob with no type: no Content-Type header at all
    assert untyped.status_code == 415 and "None" in message(untyped)
    form = httpx.post(server + "/init_weight_transfer_engine", content=b'{"init_info": {"backend": "shm"}}',
                      headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert form.status_code == 415 and "application/json" in message(form)
    cross = httpx.post(blob_url, content=blob, headers=OCTET | {"Origin": EVIL})
    assert cross.status_code == 403 and EVIL in message(cross)
    paused = httpx.post(server + "/pause?mode=keep", headers={"Origin": EVIL})
    assert paused.status_code == 403
    assert httpx.get(server + "/is_paused").json()["is_paused"] is False
    assert httpx.get(server + "/health", headers={"Origin": EVIL}).status_code == 200  # reads stay open
    assert served(server) == before  # nothing changed: weights and version


def test_versions_are_int64_and_never_go_backwards(server, blob):
    url = server + "/ludic/update_weights_blob?version="
    for bad, says in (("-5", "-5 is out of range"), (str(10**23), f"{10**23} is out of range"), ("1.5", "'1.5'")):
        refused = httpx.post(url + bad, content=blob, headers=OCTET)
        assert refused.status_code == 400 and says in message(refused), refused.text
    assert served(server)[1] == 0
    assert httpx.post(url + "9", content=blob, headers=OCTET).status_code == 200
    back = httpx.post(url + "8", content=blob, headers=OCTET)
    assert back.status_code == 400 and "weight version 8 is below the served policy_version 9" in message(back)
    assert httpx.post(url + "9", content=blob, headers=OCTET).status_code == 200  # the same version again is fine
    assert served(server)[1] == 9


def test_the_embedded_engine_refuses_the_same_versions():
    engine = TransformersChatClient(tiny_model_path())
    norm = {"model.norm.weight": engine.model.model.norm.weight.detach() * 1.5}
    for bad in (-5, 10**23):
        with pytest.raises(ValueError, match=f"weight version {bad} is out of range"):
            engine.sync_weights(norm, version=bad)
    engine.sync_weights(norm, version=4)
    with pytest.raises(ValueError, match="below the served policy_version 4"):
        engine.sync_weights({"model.norm.weight": torch.ones(128)}, version=3)
    assert engine.policy_version == 4
    assert torch.equal(engine.model.model.norm.weight, norm["model.norm.weight"])  # the refused one did not land
    assert SamplingConfig(max_tokens=1)  # the engine still takes requests
