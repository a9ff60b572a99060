"""The simulated hosts themselves: reachability, isolation from the machine, a cut and a slow link, teardown."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ludic.testing.netns import HostNetwork
from ludic.testing.netns_commands import NetworkCommandError, namespaces

PORT = 7000
# A TCP echo server bound to argv[1]; prints "up" once it listens.
ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); print("up", flush=True)
while True:
    c, _ = s.accept()
    while data := c.recv(65536):
        c.sendall(data)
    c.close()
"""
# Sends argv[3] to argv[1]:argv[2] and prints what came back.
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
c.sendall(sys.argv[3].encode()); print(c.recv(100).decode())
"""


def start_echo(net: HostNetwork, host: str) -> subprocess.Popen:
    proc = net.popen(host, [sys.executable, "-c", ECHO, net.address(host), str(PORT)], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    return proc


def connect(address: str, timeout: float = 1.0) -> socket.socket:
    return socket.create_connection((address, PORT), timeout=timeout)


def round_trip(address: str, n: int = 5) -> list[float]:
    """Seconds per 1-byte echo round trip on one connection, ``n`` times."""
    with connect(address, timeout=5) as sock:
        times = []
        for _ in range(n):
            start = time.monotonic()
            sock.sendall(b"x")
            assert sock.recv(1) == b"x"
            times.append(time.monotonic() - start)
        return times


def test_a_host_reaches_another_at_its_address(host_network) -> None:
    net = host_network(["alpha", "beta"])
    assert net.address("alpha") != net.address("beta")
    start_echo(net, "alpha")
    done = net.run(
        "beta", [sys.executable, "-c", CLIENT, net.address("alpha"), str(PORT), "hello"], timeout=30
    )
    assert done.stdout.strip() == "hello"
    # Code in this process can join a host's network too (the test's own probes).
    with net.call("beta", connect, net.address("alpha")) as sock:
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"


def test_a_host_cannot_reach_the_machines_own_services(host_network) -> None:
    net = host_network(["alpha"])
    with socket.socket() as listener:  # a service of the machine, on its loopback and every address
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(ConnectionRefusedError):  # the host's own loopback: nothing listens there
            net.call("alpha", socket.create_connection, ("127.0.0.1", port), 1.0)
        outside = [a for a in _machine_addresses() if not a.startswith("127.")]
        assert outside, "the machine has no address besides loopback to check"
        for address in outside:
            with pytest.raises(OSError):  # no route out of the simulated network
                net.call("alpha", socket.create_connection, (address, port), 1.0)
        # The machine's services are still there for the machine itself.
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def _machine_addresses() -> list[str]:
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


def test_link_down_cuts_a_host_off_within_a_bound_and_link_up_restores_it(host_network) -> None:
    net = host_network(["alpha", "beta", "gamma"])
    start_echo(net, "alpha")
    start_echo(net, "gamma")
    net.call("beta", connect, net.address("alpha")).close()
    net.link_down("alpha")
    start = time.monotonic()
    with pytest.raises(OSError):
        net.call("beta", connect, net.address("alpha"), 1.0)
    assert time.monotonic() - start < 3.0
    net.call("beta", connect, net.address("gamma")).close()  # the rest of the network is untouched
    net.link_up("alpha")
    deadline = time.monotonic() + 10
    while True:
        try:
            net.call("beta", connect, net.address("alpha")).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "alpha unreachable 10 s after link_up"
            time.sleep(0.1)


def test_netem_delay_shows_in_the_round_trip_and_clearing_removes_it(host_network) -> None:
    net = host_network(["alpha", "beta"])
    start_echo(net, "alpha")
    assert statistics.median(net.call("beta", round_trip, net.address("alpha"))) < 0.05
    net.netem("alpha", delay_ms=100)
    delayed = statistics.median(net.call("beta", round_trip, net.address("alpha")))
    assert 0.1 <= delayed < 0.3
    net.clear_netem("alpha")
    net.call("beta", round_trip, net.address("alpha"), 1)  # the bridge relearns where alpha is
    assert statistics.median(net.call("beta", round_trip, net.address("alpha"))) < 0.05
    with pytest.raises(ValueError, match="loss_pct=101"):
        net.netem("alpha", loss_pct=101)


def test_netem_loss_drops_that_fraction_of_a_hosts_frames(host_network) -> None:
    net = host_network(["alpha", "beta"])
    net.netem("beta", loss_pct=50)
    received = []
    with net.call("alpha", socket.socket, socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind((net.address("alpha"), PORT))
        rx.settimeout(0.5)
        with net.call("beta", socket.socket, socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for i in range(400):
                tx.sendto(str(i).encode(), (net.address("alpha"), PORT))
                time.sleep(0.0005)
        try:
            while True:
                received.append(rx.recv(16))
        except TimeoutError:
            pass
    assert 120 <= len(received) <= 280  # 50% of 400 (binomial sd 10)


def test_kill_host_ends_every_process_in_it_and_only_there(host_network) -> None:
    net = host_network(["alpha", "beta"])
    # A grandchild in a session of its own, as a daemon would make: it is still in alpha's network.
    daemon = net.run("alpha", ["sh", "-c", "setsid sleep 300 > /dev/null 2>&1 & echo $!"], timeout=10)
    grandchild = int(daemon.stdout)
    child = net.popen("alpha", ["sleep", "300"])
    survivor = net.popen("beta", ["sleep", "300"])
    net.kill_host("alpha")
    assert child.returncode == -signal.SIGKILL
    assert not _alive(grandchild)
    assert survivor.poll() is None
    start_echo(net, "alpha")  # the "machine" can run again: its network stayed up


def test_close_leaves_no_namespace_relay_or_process_even_when_the_test_raised() -> None:
    with pytest.raises(RuntimeError, match="the test body failed"), HostNetwork(["alpha", "beta"]) as net:
        prefix = net.prefix
        proc = net.popen("alpha", ["sleep", "300"])
        net.netem("beta", delay_ms=10)
        relay = net._shapers["beta"]
        assert {f"{prefix}alpha", f"{prefix}beta", net.bridge} <= set(namespaces())
        raise RuntimeError("the test body failed")
    assert not [n for n in namespaces() if n.startswith(prefix)]
    assert proc.returncode == -signal.SIGKILL and relay.returncode is not None
    net.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        net.popen("alpha", ["true"])


def test_a_killed_runs_namespaces_and_processes_are_removed_by_the_next_network(host_network) -> None:
    script = (
        "from ludic.testing.netns import HostNetwork\n"
        "net = HostNetwork(['alpha'])\n"
        "p = net.popen('alpha', ['sleep', '300'])\n"
        "print(net.prefix, p.pid, flush=True)\n"
        "import time; time.sleep(300)\n"
    )
    earlier = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    prefix, sleeper = earlier.stdout.readline().split()
    earlier.kill()  # SIGKILL: no close(), no atexit
    earlier.wait(timeout=10)
    earlier.stdout.close()
    left = [n for n in namespaces() if n.startswith(prefix)]
    assert len(left) == 2  # alpha and the bridge
    assert _alive(int(sleeper))
    net = host_network(["alpha"])
    assert sorted(net.removed_stale) == sorted(left)
    assert not [n for n in namespaces() if n.startswith(prefix)]
    assert not _alive(int(sleeper))


def test_failures_name_the_command_and_what_went_wrong(host_network) -> None:
    net = host_network(["alpha"])
    with pytest.raises(
        NetworkCommandError, match=r"`ls /no-such-dir` exited 2: \(in host alpha\) ls: .*No such"
    ):
        net.run("alpha", ["ls", "/no-such-dir"])
    with pytest.raises(NetworkCommandError, match=r"`sleep 30` timed out: ran past 0.3 s in host alpha"):
        net.run("alpha", ["sleep", "30"], timeout=0.3)
    with pytest.raises(KeyError, match=r"no host 'omega'.*\['alpha'\]"):
        net.address("omega")
    with pytest.raises(ValueError, match="Upper"):
        HostNetwork(["Upper"])
    with pytest.raises(ValueError, match="distinct"):
        HostNetwork(["alpha", "alpha"])


def test_call_is_bounded_in_time(host_network) -> None:
    net = host_network(["alpha"])
    release = threading.Event()
    with pytest.raises(TimeoutError, match=r"wait in namespace .*alpha ran past 0\.2 s"):
        net.call("alpha", release.wait, 5, timeout=0.2)
    release.set()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("required", ["1", "0"])
def test_without_namespaces_the_fixture_fails_under_require_extras_and_skips_otherwise(
    required: str, tmp_path: Path
) -> None:
    """No `ip` on the PATH: a multi-host test fails naming why in CI and is skipped with the reason elsewhere.

    The fixture's own conftest runs in a pytest of its own (tests/conftest.py's torch import left out)."""
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text("def test_probe(host_network):\n    host_network(['alpha'])\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PATH": "/nonexistent", "LUDIC_REQUIRE_EXTRAS": required}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_probe.py", "-q", "-rfEs", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    reason = "the `ip` command (iproute2) is not on the PATH"
    if required == "1":
        assert done.returncode == 1 and "1 error" in done.stdout, done.stdout[-2000:]
        assert f"simulated hosts are required under LUDIC_REQUIRE_EXTRAS=1: {reason}" in done.stdout
    else:
        assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout[-2000:]
        assert f"simulated hosts unavailable: {reason}" in done.stdout
