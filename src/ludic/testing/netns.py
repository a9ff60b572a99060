"""Simulated hosts on one Linux machine: network namespaces joined by veth pairs to one bridge.

Why: a multi-host run (trainer ranks, actors, inference servers, Redis on different machines) has to be
tested on one machine, including what happens when a host dies, a link goes down or gets slow. Each host
here is a network namespace with its own address; the only way between two of them is the bridge, so
cutting one host's port or slowing it (``netem``: delay, loss) acts like a cable pulled or a slow WAN link.

Layout (needs root and iproute2)::

    ns ludic-<pid>-<seq>-0br:   br0 ── p0, p1, ...            (the switch; no address; own namespace)
    ns ludic-<pid>-<seq>-NAME:  lo, eth0 ── peer of p<k>      (10.213.S.<k+2>/24)

Nothing is created in the machine's own (root) namespace and none of its interfaces is touched; traffic goes
only between addresses made here. A killed earlier run's namespaces (prefix with a dead pid) are removed
when a new network starts. ``close()`` (also at exit and as a context manager) kills every process started
in a host and deletes every namespace.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import count
from typing import Any, TypeVar

from ludic.testing import link_shaper
from ludic.testing.netns_commands import (
    NAMESPACE_PREFIX,
    NetworkCommandError,
    call_in_namespace,
    command,
    delete_namespace,
    kill_namespace,
    remove_stale_namespaces,
)

T = TypeVar("T")
_HOST_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_SEQ = count()
WAIT_S = 10.0  # how long a killed process may take to be reaped before it is reported


class HostNetwork:
    """N simulated hosts, each a network namespace with one address on a shared private /24.

    ``subnet`` is the /24's third octet in 10.213.S.0/24 (addresses exist only inside these namespaces,
    so two networks at once, in two test processes, do not clash).
    """

    def __init__(self, hosts: Sequence[str], subnet: int = 0) -> None:
        names = list(hosts)
        bad = [h for h in names if not _HOST_NAME.match(h)]
        if bad or not names or len(set(names)) != len(names) or len(names) > 250:
            raise ValueError(
                f"hosts {names!r}: give 1-250 distinct names of a lowercase letter then up to 31 of "
                f"[a-z0-9_] (bad: {bad!r})"
            )
        if not 0 <= subnet <= 255:
            raise ValueError(f"subnet {subnet} is the third octet of 10.213.S.0/24: 0-255")
        self.hosts = names
        self.prefix = f"{NAMESPACE_PREFIX}{os.getpid()}-{next(_SEQ)}-"
        self.bridge = self.prefix + "0br"  # hosts start with a letter: no host namespace has this name
        self._addresses = {h: f"10.213.{subnet}.{k + 2}" for k, h in enumerate(names)}
        self._ports = {h: f"p{k}" for k, h in enumerate(names)}
        self._procs: dict[str, list[subprocess.Popen]] = {h: [] for h in names}
        self._shapers: dict[str, subprocess.Popen] = {}  # host -> its link_shaper relay
        self._closed = False
        atexit.register(self.close)
        try:
            self.removed_stale = remove_stale_namespaces()
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        br = ["ip", "-n", self.bridge]
        command(["ip", "netns", "add", self.bridge])
        command([*br, "link", "set", "lo", "up"])
        command([*br, "link", "add", "br0", "type", "bridge", "stp_state", "0"])
        command([*br, "link", "set", "br0", "up"])
        for host in self.hosts:
            ns, port = self.namespace(host), self._ports[host]
            command(["ip", "netns", "add", ns])
            # Made inside the bridge's namespace with its peer moved straight into the host's: no veth end
            # ever appears in the machine's own namespace.
            command([*br, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
            command([*br, "link", "set", port, "master", "br0", "up"])
            command(["ip", "-n", ns, "addr", "add", f"{self._addresses[host]}/24", "dev", "eth0"])
            command(["ip", "-n", ns, "link", "set", "eth0", "up"])
            command(["ip", "-n", ns, "link", "set", "lo", "up"])

    # -- names ---------------------------------------------------------------------------------------------
    def namespace(self, host: str) -> str:
        """The network namespace of ``host`` (``ip netns exec`` takes it)."""
        self._check(host)
        return self.prefix + host

    def address(self, host: str) -> str:
        """``host``'s IPv4 address, reachable from every other host of this network."""
        self._check(host)
        return self._addresses[host]

    # -- processes -----------------------------------------------------------------------------------------
    def popen(
        self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen:
        """Start ``argv`` inside ``host`` (``ip netns exec``), tracked so that kill_host/close end it.

        ``env`` is added to this process's environment; other keyword arguments go to ``subprocess.Popen``
        (``stdout=``, ``cwd=``, ...). The process leads a session of its own, so its children die with it.
        """
        if self._closed:
            raise RuntimeError(f"HostNetwork {self.prefix}* is closed; cannot start {list(argv)!r} in {host}")
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.namespace(host), *argv],
            env=full_env,
            start_new_session=True,
            **kwargs,
        )
        self._procs[host].append(proc)
        return proc

    def run(
        self, host: str, argv: Sequence[str], timeout: float = 60.0, check: bool = True, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in ``host`` to completion (text output captured); killed after ``timeout`` seconds.

        NetworkCommandError (naming the command and its stderr) when it fails and ``check``, or times out.
        """
        proc = self.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            self._kill(proc)
            raise NetworkCommandError(argv, None, f"ran past {timeout:g} s in host {host}") from exc
        if check and proc.returncode != 0:
            raise NetworkCommandError(argv, proc.returncode, f"(in host {host}) {err}")
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def call(self, host: str, fn: Callable[..., T], *args: object, timeout: float = 30.0) -> T:
        """``fn(*args)`` in this process, on a thread inside ``host``'s network (its sockets live there)."""
        return call_in_namespace(self.namespace(host), fn, *args, timeout=timeout)

    def kill_host(self, host: str) -> None:
        """SIGKILL every process in ``host``, as if the machine lost power; its network stays up."""
        for proc in self._procs[host]:
            self._kill(proc)
        kill_namespace(self.namespace(host))  # anything that escaped its session (a daemonised child)

    # -- links ---------------------------------------------------------------------------------------------
    def link_down(self, host: str) -> None:
        """Cut ``host``'s cable: its bridge port goes down, packets to and from it are dropped (on a ``netem``
        link, the relay's port too: frames it still holds are lost, not delivered late)."""
        for port in self._cable(host):
            command(["ip", "-n", self.bridge, "link", "set", port, "down"])

    def link_up(self, host: str) -> None:
        """Plug ``host``'s cable back in."""
        for port in self._cable(host):
            command(["ip", "-n", self.bridge, "link", "set", port, "up"])

    def _cable(self, host: str) -> list[str]:
        port = self._port(host)
        return [port, "q" + port[1:]] if host in self._shapers else [port]

    def netem(
        self, host: str, delay_ms: float = 0.0, loss_pct: float = 0.0, rate_kbit: float | None = None
    ) -> None:
        """Slow or lossy link: every frame ``host`` sends waits ``delay_ms`` and is dropped with ``loss_pct``%;
        with ``rate_kbit``, the frames leave one after another at that rate (a narrow link).

        Only ``host``'s outgoing frames, so a round trip between it and any peer gains ``delay_ms`` (not
        twice). A second call replaces the first. ``tc netem``'s job, done by ``ludic.testing.link_shaper``
        (these kernels lack sch_netem): the host's bridge port leaves the bridge and a user-space relay
        carries its frames to a new port in its place.
        """
        if delay_ms < 0 or not 0 <= loss_pct <= 100 or (rate_kbit is not None and rate_kbit <= 0):
            raise ValueError(f"netem delay_ms={delay_ms} loss_pct={loss_pct} rate_kbit={rate_kbit}: need "
                             "delay >= 0, 0 <= loss <= 100, rate > 0 (or None)")  # fmt: skip
        self.clear_netem(host)
        br, port = ["ip", "-n", self.bridge], self._port(host)
        relay, relay_peer = "q" + port[1:], "r" + port[1:]
        command([*br, "link", "add", relay, "type", "veth", "peer", "name", relay_peer])
        command([*br, "link", "set", relay_peer, "master", "br0", "up"])
        command([*br, "link", "set", relay, "up"])
        argv = [sys.executable, link_shaper.__file__, port, relay, "--delay-ms", str(delay_ms),
                "--loss-pct", str(loss_pct), *(["--rate-kbit", str(rate_kbit)] if rate_kbit else [])]  # fmt: skip
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.bridge, *argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        self._shapers[host] = proc
        if not _await_line(proc, b"ready", timeout=WAIT_S):
            self.clear_netem(host)
            raise NetworkCommandError(argv, proc.returncode, proc.stderr.read().decode(errors="replace"))
        command([*br, "link", "set", port, "nomaster"])  # from now on only the relay carries its frames

    def clear_netem(self, host: str) -> None:
        """Back to a plain link (no delay, no loss); nothing to do if none was set."""
        proc = self._shapers.pop(host, None)
        if proc is None:
            return
        br, port = ["ip", "-n", self.bridge], self._port(host)
        self._kill(proc)
        proc.stdout.close()
        proc.stderr.close()
        command([*br, "link", "del", "q" + port[1:]])  # its peer leaves the bridge with it
        command([*br, "link", "set", port, "master", "br0"])

    # -- teardown ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process started in a host and delete every namespace (the veths go with them).

        Idempotent. Each host is torn down even if an earlier one fails; the first failure is raised after.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        errors: list[BaseException] = []
        for proc in self._shapers.values():  # the relays live in the bridge's namespace, deleted below
            try:
                self._kill(proc)
            except TimeoutError as err:
                errors.append(err)
        for host in self.hosts:
            try:
                for proc in self._procs[host]:
                    self._kill(proc)
                delete_namespace(self.namespace(host))
            except (NetworkCommandError, TimeoutError, OSError) as err:
                errors.append(err)
        try:
            delete_namespace(self.bridge)
        except (NetworkCommandError, TimeoutError, OSError) as err:
            errors.append(err)
        if errors:
            raise errors[0]

    def __enter__(self) -> HostNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers -------------------------------------------------------------------------------------------
    def _check(self, host: str) -> None:
        if host not in self._addresses:
            raise KeyError(f"no host {host!r} in this network; hosts: {self.hosts}")

    def _port(self, host: str) -> str:
        self._check(host)
        return self._ports[host]

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired as err:
            raise TimeoutError(
                f"process {proc.pid} ({proc.args!r}) still alive {WAIT_S:.0f} s after SIGKILL"
            ) from err


def unavailable_reason() -> str | None:
    """Why simulated hosts cannot be made here (not root, no ``ip``, namespaces refused), or None if they can."""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not on the PATH"
    probe = f"{NAMESPACE_PREFIX}{os.getpid()}-{next(_SEQ)}-probe"  # a dead run's probe counts as stale
    try:
        command(["ip", "netns", "add", probe])
        command(["ip", "netns", "del", probe])
    except NetworkCommandError as err:
        return f"cannot make a network namespace: {err}"
    return None


def _await_line(proc: subprocess.Popen, line: bytes, timeout: float) -> bool:
    """Whether ``proc`` printed ``line`` within ``timeout`` seconds (False if it exited or stayed silent)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if select.select([proc.stdout], [], [], left)[0]:
            out = proc.stdout.readline()
            if out.strip() == line:
                return True
            if not out:
                proc.wait(timeout=WAIT_S)
                return False
    return False
