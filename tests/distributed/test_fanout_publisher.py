"""``FanoutPublisher`` against two real Ludic servers on loopback (subprocesses, bearer token required):
every version reaches both; a server that stops answering during a publish (SIGSTOP: its port still
accepts, nothing reads) ends that publish within the bound with an error naming it, the operation and the
wait, while the other server is brought up to date; the stalled server keeps serving its last complete
version and the next publish brings it up to date; ``on_failure="stop"`` and a publish no server got raise.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.cli.distributed_run import fanout_publisher
from ludic.config.cluster_section import ClusterSection
from ludic.distributed.fanout import FanoutPublisher, FanoutPublishError
from ludic.testing import build_tiny_model
from ludic.testing.server_process import start_server, stop_server

TOKEN = "fanout-test-token"


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory):
    """~16 MB of float32 weights: more than loopback's socket buffers hold, so a stalled server blocks the upload."""
    return build_tiny_model(
        tmp_path_factory.mktemp("fanout"), seed=0, hidden_size=256, intermediate_size=1024
    )


@pytest.fixture(scope="module")
def servers(big_model):
    procs = [start_server(big_model, "--api-key", TOKEN) for _ in range(2)]
    try:
        yield procs
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
            stop_server(proc)


def _version(url: str) -> int:
    return int(httpx.get(url + "/policy_version", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
               .json()["policy_version"])  # fmt: skip


def _logprob(url: str) -> float:
    """The served model's log-prob of its greedy next token after a fixed prompt (changes with every weight)."""
    body = {"model": "m", "prompt": [72, 101, 108, 108], "max_tokens": 1, "temperature": 0.0, "logprobs": 0,
            "return_token_ids": True}  # fmt: skip
    reply = httpx.post(
        url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    return float(reply.json()["choices"][0]["logprobs"]["token_logprobs"][0])


def _weights(model_dir, scale: float) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {k: v * scale for k, v in model.state_dict().items() if k != "lm_head.weight"}


def _publisher(urls: list[str], monkeypatch, **kwargs) -> FanoutPublisher:
    monkeypatch.setenv("FANOUT_TEST_KEY", TOKEN)
    cluster = ClusterSection(
        servers=urls, redis_url="redis://127.0.0.1:6379/0", api_key_env="FANOUT_TEST_KEY"
    )
    return fanout_publisher(cluster, **kwargs)


@pytest.mark.slow
def test_every_server_gets_each_version_and_a_stalled_one_is_named_bounded_and_caught_up(
    servers, big_model, monkeypatch
):
    (_, a), (proc_b, b) = servers
    fan = _publisher([a, b], monkeypatch, timeout_s=3.0)
    initial = _logprob(a)
    fan.publish(_weights(big_model, 1.01), version=1)
    assert (_version(a), _version(b)) == (1, 1)
    v1 = _logprob(a)
    assert v1 == pytest.approx(_logprob(b), abs=1e-6) and v1 != pytest.approx(initial, abs=1e-6)
    assert fan.last_stats["publish_servers_ok"] == 2.0 and fan.last_stats["publish_servers_failed"] == 0.0
    # The stalled upload goes out on a new connection. The one kept from version 1's upload has a receive window
    # the kernel grew while B read that upload (up to net.ipv4.tcp_rmem's maximum, 32 MB on one Zen 5 host): the
    # whole ~16 MB blob then fits in the stopped B's socket buffer and B applies it when it resumes. A new
    # connection's window grows only as B reads, so there the upload stalls, as a hung server's would.
    fan.close()
    fan = _publisher([a, b], monkeypatch, timeout_s=3.0)

    os.kill(proc_b.pid, signal.SIGSTOP)  # B's port still accepts connections; nothing reads the upload
    try:
        started = time.monotonic()
        fan.publish(_weights(big_model, 1.02), version=2)  # on_failure="skip": the run goes on
        waited = time.monotonic() - started
        assert waited < 3.0 + 2.0, f"the publish took {waited:.1f} s with a 3 s bound"
        assert _version(a) == 2  # the answering server is up to date
        assert fan.last_stats["publish_servers_failed"] == 1.0
        (failure,) = fan.failures
        text = failure.describe()
        assert b in text and "POST /ludic/update_weights_blob" in text and "version 2" in text
        assert failure.waited_s == pytest.approx(3.0, abs=1.5)
        deadline = time.monotonic() + 30
        while (
            fan.in_flight() and time.monotonic() < deadline
        ):  # the stalled upload ends at its socket timeout
            time.sleep(0.2)
        assert fan.in_flight() == []
    finally:
        os.kill(proc_b.pid, signal.SIGCONT)
    assert _version(b) == 1  # the cut upload changed nothing: the last complete version is still served
    assert _logprob(b) == pytest.approx(v1, abs=1e-6)

    fan.publish(_weights(big_model, 1.03), version=3)  # full weights again: B catches up
    assert (_version(a), _version(b)) == (3, 3)
    assert _logprob(a) == pytest.approx(_logprob(b), abs=1e-6)
    fan.close()


@pytest.mark.slow
def test_stop_policy_raises_naming_the_server_and_no_server_reached_always_raises(
    servers, big_model, monkeypatch
):
    (_, a), _ = servers
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens on loopback, the connection is refused
    version = _version(a)
    stop = _publisher([a, dead], monkeypatch, timeout_s=5.0, on_failure="stop")
    with pytest.raises(FanoutPublishError) as caught:
        stop.publish(_weights(big_model, 1.04), version=version + 1)
    message = str(caught.value)
    assert "reached 1 of 2 servers" in message and dead in message and "update_weights_blob" in message
    assert _version(a) == version + 1  # the reachable server still got it
    skip = _publisher([dead], monkeypatch, timeout_s=5.0)
    with pytest.raises(FanoutPublishError, match="reached 0 of 1"):
        skip.publish(_weights(big_model, 1.05), version=version + 2)


def test_bad_arguments_are_refused_naming_them():
    with pytest.raises(ValueError, match="on_failure"):
        FanoutPublisher({"http://x:1": object()}, on_failure="retry")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        FanoutPublisher({"http://x:1": object()}, timeout_s=0)
    with pytest.raises(TypeError, match="http://x:1"):
        FanoutPublisher({"http://x:1": object()})
    with pytest.raises(ValueError, match="at least one"):
        FanoutPublisher({})
