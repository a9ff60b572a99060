"""The shared-memory weight transfer against a real server subprocess: an update has one owner (a second
publisher cannot mix into it), a shared buffer never becomes live weights (the trainer's later writes
change nothing served), and the trainer maps only what is provably the server's memfd."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.distributed.shared_buffers import PeerBuffers
from ludic.inference import VLLMChatClient
from ludic.inference.weight_sync.packing import TensorMeta, pack, packed_size, update_info
from ludic.inference.weight_sync.shared_memory import allocate_shared, map_peer_buffer
from ludic.testing.server_process import running_server

from .test_broadcast_publisher import greedy_logps, model_logps

pytestmark = pytest.mark.integration
NORM = "model.norm.weight"


@pytest.fixture(scope="module")
def url(dirs: tuple[Path, Path]) -> Iterator[str]:
    with running_server(dirs[0], ["--transfer-timeout", "3"]) as base:
        assert post(base, "/init_weight_transfer_engine", {"init_info": {"backend": "shm"}}).status_code == 200
        yield base


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=20)


def write_call(url: str, update_id: str, tensors: dict[str, torch.Tensor]) -> tuple[dict, torch.Tensor]:
    """Reserve a buffer for ``tensors``, pack them into it (mapped here), send the call; (its update_info, mapping)."""
    metas = [TensorMeta.of(n, t) for n, t in tensors.items()]
    info = update_info(metas, packed=True)
    reservation = post(url, "/ludic/reserve_weight_buffer", {"update_info": info, "update_id": update_id}).json()
    port = int(url.rsplit(":", 1)[1])
    mapping = PeerBuffers(port).view(reservation, packed_size(metas))
    pack(list(tensors.values()), out=mapping)
    return info | {"shm_buffer": reservation["buffer"]}, mapping


def test_a_second_publisher_cannot_mix_into_an_update_in_progress(url, dirs):
    client = VLLMChatClient(base_url=url)
    new = AutoModelForCausalLM.from_pretrained(dirs[1]).state_dict()
    version = httpx.get(url + "/policy_version").json()["policy_version"]
    first = post(url, "/start_weight_update", {}).json()["update_id"]
    second = post(url, "/start_weight_update", {})
    assert second.status_code == 409 and first in second.json()["error"]["message"]
    assert post(url, "/init_weight_transfer_engine", {"init_info": {"backend": "shm"}}).status_code == 409
    garbage = {NORM: torch.full((128,), 9.0)}
    info = update_info([TensorMeta.of(NORM, garbage[NORM])], packed=True)
    for body in ({"update_info": info}, {"update_info": info, "update_id": "u-someone-else"}):
        assert post(url, "/ludic/reserve_weight_buffer", body).status_code in (400, 409)
    assert post(url, "/finish_weight_update", {"weight_version": "50", "update_id": "u-x"}).status_code == 409
    call, _ = write_call(url, first, {k: v for k, v in new.items() if k != "lm_head.weight"})
    assert post(url, "/update_weights", {"update_info": call, "update_id": first}).status_code == 200
    done = post(url, "/finish_weight_update", {"weight_version": str(version + 1), "update_id": first})
    assert done.status_code == 200, done.text
    served, served_version = greedy_logps(client)
    assert served_version == version + 1
    assert served == pytest.approx(model_logps(AutoModelForCausalLM.from_pretrained(dirs[1]), client), abs=1e-4)


def test_an_abandoned_update_is_taken_over_and_its_publisher_is_then_refused(url):
    stale = post(url, "/start_weight_update", {}).json()["update_id"]
    assert post(url, "/start_weight_update", {}).status_code == 409
    time.sleep(3.2)  # the server's transfer timeout: the owner went quiet
    fresh = post(url, "/start_weight_update", {}).json()["update_id"]
    norm = {NORM: torch.ones(128)}
    info = update_info([TensorMeta.of(NORM, norm[NORM])], packed=True)
    late = post(url, "/ludic/reserve_weight_buffer", {"update_info": info, "update_id": stale})
    assert late.status_code == 409 and stale in late.json()["error"]["message"]
    assert post(url, "/ludic/abort_weight_update", {"update_id": fresh}).json()["status"] == "aborted"


def test_writes_through_the_trainers_mapping_after_an_update_change_nothing_served(url, dirs):
    client = VLLMChatClient(base_url=url)
    version = httpx.get(url + "/policy_version").json()["policy_version"]
    old = AutoModelForCausalLM.from_pretrained(dirs[0])
    update_id = post(url, "/start_weight_update", {}).json()["update_id"]
    call, mapping = write_call(url, update_id, {k: v for k, v in old.state_dict().items() if k != "lm_head.weight"})
    assert post(url, "/update_weights", {"update_info": call, "update_id": update_id}).status_code == 200
    assert post(url, "/finish_weight_update", {"weight_version": str(version + 1), "update_id": update_id}).status_code == 200
    before = greedy_logps(client)
    mapping.fill_(0x7F)  # the buffer is still mapped writable here: NaN-ish garbage over every byte
    after = greedy_logps(client)
    assert after == before and after[1] == version + 1
    assert after[0] == pytest.approx(model_logps(old, client), abs=1e-4)


def test_the_trainer_refuses_to_map_anything_but_the_servers_memfd(tmp_path):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious" * 8)
    fd = os.open(victim, os.O_RDWR)
    try:
        with pytest.raises(RuntimeError, match="not a weight buffer of Ludic's server"):
            map_peer_buffer(os.getpid(), fd, 64)  # a file on disk, of the announced size
    finally:
        os.close(fd)
    assert victim.read_bytes() == b"precious" * 8
    other = os.memfd_create("not-ludic")
    os.ftruncate(other, 64)
    try:
        with pytest.raises(RuntimeError, match="not a weight buffer"):
            map_peer_buffer(os.getpid(), other, 64)
    finally:
        os.close(other)
    ours = allocate_shared(64, 99)  # a genuine buffer, but this process serves no port
    try:
        assert map_peer_buffer(os.getpid(), ours.fd, 64).numel() == 64
        with pytest.raises(RuntimeError, match="does not listen on port 1"):
            PeerBuffers(1).view({"pid": os.getpid(), "buffer": 99, "fd": ours.fd, "file_bytes": 64}, 64)
    finally:
        ours.close()
