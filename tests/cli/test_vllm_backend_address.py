"""``[inference] backend = "vllm"``: the trainer hosts the weight-transfer rendezvous at its own address on the
route to the server (``ludic.cli.runtime.address_towards``), which the server joins."""

from __future__ import annotations

import pytest

from ludic.cli.runtime import address_towards


def test_a_loopback_server_gets_the_loopback_address() -> None:
    assert address_towards("http://127.0.0.1:8000") == "127.0.0.1"
    assert address_towards("http://localhost:8000/") == "127.0.0.1"


def test_a_server_host_that_does_not_resolve_is_named() -> None:
    with pytest.raises(ValueError, match=r"server_url 'http://no-such-host\.invalid:8000': no route to its host"):
        address_towards("http://no-such-host.invalid:8000")
