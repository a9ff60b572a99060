"""The user-space relay behind ``HostNetwork.netem`` (``ludic.testing.link_shaper``): a narrow link's rate, and a
cable pulled and plugged back while the relay carries the host's frames."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time

import pytest

from ludic.testing import link_shaper
from ludic.testing.netns import HostNetwork

PORT = 7100
# Reads everything from one connection at a time, then answers with how many bytes it got; prints "up".
SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); print("up", flush=True)
while True:
    c, _ = s.accept(); n = 0
    while data := c.recv(65536):
        n += len(data)
    c.sendall(str(n).encode()); c.close()
"""


def start_sink(net: HostNetwork, host: str) -> None:
    proc = net.popen(host, [sys.executable, "-c", SINK, net.address(host), str(PORT)], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"


def send_seconds(address: str, size: int) -> float:
    """Seconds from connecting to ``address`` to the sink's count of the ``size`` bytes sent (asserted)."""
    start = time.monotonic()
    with socket.create_connection((address, PORT), timeout=30) as sock:
        sock.sendall(b"x" * size)
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(100) == str(size).encode()
    return time.monotonic() - start


def test_a_rate_limited_link_takes_its_bytes_time_and_only_one_way(host_network) -> None:
    net = host_network(["alpha", "beta"])
    start_sink(net, "alpha")
    size = 40_000
    assert net.call("beta", send_seconds, net.address("alpha"), size) < 0.5
    net.netem("beta", rate_kbit=160)  # 20 kB/s: 40 kB (and its headers) need >= 2 s on beta's way out
    narrow = net.call("beta", send_seconds, net.address("alpha"), size)
    assert 2.0 <= narrow < 8.0, narrow
    start_sink(net, "beta")  # the other way (alpha -> beta) is not slowed
    assert net.call("alpha", send_seconds, net.address("beta"), size) < 1.0
    with pytest.raises(ValueError, match="rate_kbit=0"):
        net.netem("beta", rate_kbit=0)
    with pytest.raises(ValueError, match="rate_kbit=-1"):
        link_shaper.forward("lo", "lo", 0.0, 0.0, rate_kbit=-1)


@pytest.mark.slow  # real link delays: ~7 s
def test_pulling_a_shaped_hosts_cable_loses_what_the_relay_holds_and_plugging_it_back_restores_it(
    host_network,
) -> None:
    net = host_network(["alpha", "beta"])
    net.netem("beta", delay_ms=1500)
    with net.call("alpha", socket.socket, socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind((net.address("alpha"), PORT))
        rx.settimeout(0.5)
        with net.call("beta", socket.socket, socket.AF_INET, socket.SOCK_DGRAM) as tx:
            tx.sendto(b"before", (net.address("alpha"), PORT))  # also resolves alpha's MAC (ARP)
            rx.settimeout(5.0)
            assert rx.recv(16) == b"before"
            tx.sendto(b"held", (net.address("alpha"), PORT))  # in the relay for 1.5 s
            net.link_down("beta")
            time.sleep(0.3)
            net.link_up("beta")  # back before "held" was due: it must still be gone with the pulled cable
            received, deadline = [], time.monotonic() + 15
            rx.settimeout(0.5)
            while b"after" not in received:  # the relay came through the cut: beta's frames cross again
                assert time.monotonic() < deadline, f"beta unreachable 15 s after link_up; got {received}"
                tx.sendto(b"after", (net.address("alpha"), PORT))
                with contextlib.suppress(TimeoutError):
                    received.append(rx.recv(16))
    assert b"held" not in received, received  # ("after" left 1.5 s later than it was due)
