"""BroadcastPolicyPublisher(backend="shm") against Ludic's server in a real subprocess on this host: the
trainer packs into the server's memfd buffers, the server checks and adopts them."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.distributed import BroadcastPolicyPublisher, PublishError
from ludic.inference import VLLMChatClient
from ludic.inference.weight_sync.packing import TensorMeta, update_info
from ludic.inference.weight_sync.shared_memory import map_peer_buffer
from ludic.testing.server_process import start_server, stop_server

from .test_broadcast_publisher import greedy_logps, model_logps

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(dirs: tuple[Path, Path]) -> Iterator[tuple[subprocess.Popen, str]]:
    proc, url = start_server(dirs[0], "--transfer-timeout", "3")
    try:
        yield proc, url
    finally:
        stop_server(proc)


def weight_buffers(pid: int) -> set[int]:
    """The ``ludic-weights`` memfds process ``pid`` holds open or has mapped, by inode (read from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed since the listing (e.g. the listing's own)
            if "ludic-weights" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
    with open(f"/proc/{pid}/maps") as maps:  # address perms offset dev inode path
        inodes |= {int(line.split()[4]) for line in maps if "ludic-weights" in line}
    return inodes


def mapped_here(server_pid: int) -> set[int]:
    """The server's buffers this (trainer) process has mapped."""
    return weight_buffers(os.getpid()) & weight_buffers(server_pid)


def test_shm_publishes_serve_the_new_weights_from_two_alternating_sets_of_buffers(server, dirs):
    proc, url = server
    client = VLLMChatClient(base_url=url, enable_weight_updates=True)
    models = [AutoModelForCausalLM.from_pretrained(d) for d in dirs]
    publisher = BroadcastPolicyPublisher(client, backend="shm", bucket_bytes=96 << 10, timeout_s=20)
    for version, model in enumerate([models[1], models[0], models[1], models[0]], start=41):
        publisher.publish(model.named_parameters(), version=version)  # an iterator, walked lazily in buckets
        served, served_version = greedy_logps(client)
        assert served_version == version
        assert served == pytest.approx(model_logps(model, client), abs=1e-4)
    stats = publisher.last_stats
    assert stats["publish_tensors"] == len(list(models[0].parameters())) and stats["server_receive_s"] > 0
    assert stats["server_alloc_bytes"] == 0  # the third and fourth updates reused the first two's buffers
    shared = mapped_here(proc.pid)  # each call is copied out on arrival: its shared buffer is free again
    assert 1 <= len(shared) <= 4  # (not one per call: 96 KiB buckets of a 3.4 MB model are 30+ calls)
    assert weight_buffers(proc.pid) == shared  # the server holds those, and nothing more
    publisher.close()


def test_a_new_layout_frees_the_old_buffers_on_both_sides(server, dirs):
    """After the small-bucket publishes above, one call per publish: the server allocates two buffers that
    fit it and closes the small ones; the trainer maps only the last two publishes' buffers."""
    proc, url = server
    client = VLLMChatClient(base_url=url, enable_weight_updates=True)
    publisher = BroadcastPolicyPublisher(client, backend="shm", timeout_s=20)  # 256 MB buckets: one call each
    model = AutoModelForCausalLM.from_pretrained(dirs[1])
    for version in range(51, 57):
        publisher.publish(model.state_dict(), version=version)
    assert len(mapped_here(proc.pid)) == 1  # one call per publish, copied out: the same buffer each time
    assert weight_buffers(proc.pid) == mapped_here(proc.pid)
    publisher.close()


def test_a_nan_update_over_shm_is_refused_and_the_old_weights_keep_serving(server, dirs):
    _, url = server
    client = VLLMChatClient(base_url=url, enable_weight_updates=True)
    model = AutoModelForCausalLM.from_pretrained(dirs[1])
    publisher = BroadcastPolicyPublisher(client, backend="shm", timeout_s=20)
    publisher.publish(model.state_dict(), version=61)
    state = AutoModelForCausalLM.from_pretrained(dirs[0]).state_dict()
    nan = dict(state) | {"model.norm.weight": torch.full_like(state["model.norm.weight"], float("nan"))}
    with pytest.raises(PublishError, match="NaN"):
        publisher.publish(nan, version=62)
    assert not client.is_paused_sync()  # the refusing /finish_weight_update resumed the server (and serves below)
    served, served_version = greedy_logps(client)
    assert served_version == 61 and served == pytest.approx(model_logps(model, client), abs=1e-4)
    publisher.close()


def test_bad_shm_calls_are_refused_and_discard_the_update(server, dirs):
    """An unreserved buffer, or a call that does not match its reservation: 400 with the reason, the
    update is discarded (finishing it is refused), and the old weights keep serving at the old version."""
    _, url = server
    client = VLLMChatClient(base_url=url, enable_weight_updates=True)
    before, before_version = greedy_logps(client)

    def post(path: str, body: dict) -> httpx.Response:
        return httpx.post(url + path, json=body, timeout=10)

    unknown = post("/init_weight_transfer_engine", {"init_info": {"backend": "rdma"}})
    assert unknown.status_code == 400 and "'rdma'" in unknown.json()["error"]["message"]
    assert post("/init_weight_transfer_engine", {"init_info": {"backend": "shm"}}).json()["backend"] == "shm"
    model = AutoModelForCausalLM.from_pretrained(dirs[1])
    norm = model.state_dict()["model.norm.weight"]
    info = update_info([TensorMeta.of("model.norm.weight", norm)], packed=True)
    for bad_call in ("unreserved", "mismatched"):
        update_id = post("/start_weight_update", {}).json()["update_id"]
        reservation = post("/ludic/reserve_weight_buffer", {"update_info": info, "update_id": update_id}).json()
        map_peer_buffer(reservation["pid"], reservation["fd"], reservation["file_bytes"])[: norm.numel() * 4].copy_(
            norm.view(torch.uint8)
        )  # fmt: skip
        if bad_call == "unreserved":
            call = info | {"shm_buffer": reservation["buffer"] + 1000}
            reason = "was not reserved"
        else:
            other = model.state_dict()["model.embed_tokens.weight"]
            call = update_info([TensorMeta.of("model.embed_tokens.weight", other)], packed=True)
            call |= {"shm_buffer": reservation["buffer"]}
            reason = "differs from the one it was reserved for"
        refused = post("/update_weights", {"update_info": call, "update_id": update_id})
        assert refused.status_code == 400 and reason in refused.json()["error"]["message"], bad_call
        finish = post("/finish_weight_update", {"weight_version": "99"})
        assert finish.status_code == 400, bad_call
    served, served_version = greedy_logps(client)
    assert served_version == before_version and served == before


def test_mapping_a_buffer_of_another_host_or_user_fails_with_a_clear_error():
    with pytest.raises(RuntimeError, match="one host, in one PID namespace, under one user"):
        map_peer_buffer(os.getpid(), 10_000, 64)


@pytest.mark.slow  # a server killed and started again: ~20 s
def test_a_server_killed_and_restarted_fails_one_publish_clearly_then_takes_the_next(dirs):
    """The restarted server has other buffers under another pid: the publisher must map those, not reuse
    its mappings of the dead server's (they would take the bytes and the new server would serve garbage)."""
    from ludic.inference.weight_sync.process_group import free_port

    port = free_port()
    proc, url = start_server(dirs[0], "--transfer-timeout", "3", port=port)
    client = VLLMChatClient(base_url=url, enable_weight_updates=True, backoff_s=0.05)
    publisher = BroadcastPolicyPublisher(client, backend="shm", timeout_s=10)
    models = [AutoModelForCausalLM.from_pretrained(d) for d in dirs]
    try:
        publisher.publish(models[1].state_dict(), version=71)
        proc.kill()
        proc.wait()
        with pytest.raises(PublishError, match="could not reach the server"):
            publisher.publish(models[0].state_dict(), version=72)
    finally:
        stop_server(proc)
    proc, url = start_server(dirs[0], "--transfer-timeout", "3", port=port)
    try:
        publisher.publish(models[1].state_dict(), version=73)
        served, served_version = greedy_logps(client)
        assert served_version == 73
        assert served == pytest.approx(model_logps(models[1], client), abs=1e-4)
    finally:
        publisher.close()
        stop_server(proc)
