"""The roles of a multi-host run placed on simulated hosts (``ludic.testing.netns.HostNetwork``).

Redis, Ludic's inference servers, actors and ``torchrun ... ludic train`` ranks each run in a host of their
own, bound to that host's address, with the tokens in their environment only (docs/cluster.md). Every log
goes to ``workdir/<name>.log`` so a failing test can show what each host said. Every wait is bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from ludic.testing.netns import HostNetwork
from ludic.testing.run_config import tiny_run_toml
from ludic.testing.torchrun import torchrun_argv
from ludic.training.pipeline.redis_server import RedisServer

T = TypeVar("T")
API_KEY_ENV, REDIS_PASSWORD_ENV = "LUDIC_NETNS_API_KEY", "LUDIC_NETNS_REDIS_PASSWORD"
REDIS_PORT, SERVER_PORT, MASTER_PORT = 6379, 8000, 29500
RUN_NAME = "netns-run"


class SimulatedCluster:
    """Starts each role in its host of ``net``; ``workdir`` holds the config, logs and run outputs."""

    def __init__(
        self, net: HostNetwork, workdir: Path, model_dir: Path, *, token: str = "netns-token"
    ) -> None:
        self.net, self.workdir, self.model_dir = net, Path(workdir), Path(model_dir)
        self.token, self.redis_password = token, "netns-redis-password"
        self.env = {
            "OMP_NUM_THREADS": "1",
            API_KEY_ENV: token,
            REDIS_PASSWORD_ENV: self.redis_password,
            # gloo picks its interface from the hostname, which resolves to loopback here: name the host's own.
            "GLOO_SOCKET_IFNAME": "eth0",
        }
        self.procs: dict[str, subprocess.Popen] = {}

    # -- roles -------------------------------------------------------------------------------------------
    def start(
        self, name: str, host: str, argv: Sequence[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """``argv`` in ``host``, logging to ``workdir/<name>.log``; ``name`` identifies it in ``procs``."""
        with open(self.workdir / f"{name}.log", "wb") as log:
            proc = self.net.popen(
                host, argv, env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs[name] = proc
        return proc

    def start_redis(self, host: str) -> str:
        """redis-server on ``host``'s address (password required); its URL without the password."""
        data = self.workdir / f"redis-{host}"
        data.mkdir(parents=True, exist_ok=True)
        redis = RedisServer(
            host=self.net.address(host), port=REDIS_PORT, data_dir=data, password=self.redis_password
        )
        self.start(f"redis-{host}", host, redis.command())
        url = self.redis_url(host)
        self.wait_for(f"redis on {host}", host, lambda: _redis_answers(redis.url), timeout=30)
        return url

    def redis_url(self, host: str) -> str:
        """``[cluster].redis_url`` of a Redis on ``host`` (no password: that comes from the environment)."""
        return f"redis://{self.net.address(host)}:{REDIS_PORT}/0"

    def server_url(self, host: str) -> str:
        """The base URL a server on ``host`` has (known before it starts, for ``[cluster].servers``)."""
        return f"http://{self.net.address(host)}:{SERVER_PORT}"

    def start_server(self, host: str, config: Path, *args: str, wait: bool = True) -> str:
        """``ludic serve CONFIG`` on ``host``'s address (token from ``[cluster].api_key_env``); its base URL,
        once up unless ``wait`` is False (then ``wait_server`` later: hosts start side by side)."""
        argv = [sys.executable, "-m", "ludic.cli", "serve", str(config), "--host", self.net.address(host),
                "--port", str(SERVER_PORT), *args]  # fmt: skip
        self.start(f"server-{host}", host, argv)
        url = self.server_url(host)
        if wait:
            self.wait_server(host, url)
        return url

    def start_actor(self, host: str, config: Path, actor_id: int, *args: str) -> subprocess.Popen:
        """``ludic actor CONFIG --actor-id I`` on ``host`` (``--set cluster.servers=[...]`` etc. in ``args``)."""
        argv = [sys.executable, "-m", "ludic.cli", "actor", str(config), "--actor-id", str(actor_id), *args]
        return self.start(f"actor-{host}", host, argv)

    def wait_server(self, host: str, url: str, timeout: float = 120.0) -> None:
        """Until ``url`` answers /health from inside ``host``."""
        self.wait_for(f"server {url}", host, lambda: _health(url), timeout=timeout)

    def start_trainers(self, hosts: Sequence[str], config: Path, *extra: str) -> list[subprocess.Popen]:
        """docs/cluster.md's trainer command on each of ``hosts``: ``torchrun --nnodes len(hosts)`` with c10d
        rendezvous on ``hosts[0]``, which assigns the ranks.

        Every simulated host shares the machine's hostname, which resolves to loopback, so what torchrun
        would learn from it is said outright: ``--local_addr`` (the address handed to the peers) and
        ``is_host`` (whether this host's agent serves the rendezvous store: the endpoint's host).
        """
        endpoint = f"{self.net.address(hosts[0])}:{MASTER_PORT}"
        procs = []
        for host in hosts:
            is_host = "true" if host == hosts[0] else "false"
            argv = torchrun_argv(self.workdir / f"torchrun-{host}", f"--nnodes={len(hosts)}",
                                 "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}",
                                 f"--rdzv_id={RUN_NAME}", f"--local_addr={self.net.address(host)}",
                                 f"--rdzv_conf=is_host={is_host}",
                                 "-m", "ludic.cli", "train", str(config), *extra)  # fmt: skip
            procs.append(self.start(f"trainer-{host}", host, argv))
        return procs

    def write_config(
        self, *, steps: int, server_hosts: Sequence[str], redis_host: str, trainer_hosts: Sequence[str],
        tables: str = "",
    ) -> Path:  # fmt: skip
        """``run.toml`` in ``workdir``: the tiny letter-repeat run with ``[cluster]`` naming these hosts."""
        servers, redis_url = [self.server_url(h) for h in server_hosts], self.redis_url(redis_host)
        listed = ", ".join(f'"{url}"' for url in servers)
        text = tiny_run_toml(
            self.model_dir,
            steps=steps,
            tables=f"""{tables.strip()}
[checkpoint]
output_dir = "{self.workdir / "ckpt"}"
every_n_steps = 1
[logging]
output_dir = "{self.workdir / "out"}"
rich = false
plot = false
[cluster]
servers = [{listed}]
redis_url = "{redis_url}"
api_key_env = "{API_KEY_ENV}"
redis_password_env = "{REDIS_PASSWORD_ENV}"
trainer_nodes = {len(trainer_hosts)}
master_addr = "{self.net.address(trainer_hosts[0])}"
master_port = {MASTER_PORT}
""",
        )
        path = self.workdir / "run.toml"
        path.write_text(text)
        return path

    # -- waiting -----------------------------------------------------------------------------------------
    def wait_for(
        self, what: str, host: str, ready: Callable[[], bool], timeout: float, every: float = 0.2
    ) -> None:
        """Poll ``ready()`` from inside ``host`` until it is true; TimeoutError with every log's tail otherwise."""
        deadline = time.monotonic() + timeout
        while not self.net.call(host, ready, timeout=max(timeout, 5.0)):
            dead = [n for n, p in self.procs.items() if p.poll() is not None and p.returncode != 0]
            if time.monotonic() > deadline or dead:
                why = f"exited: {dead}" if dead else f"not within {timeout:g} s"
                raise TimeoutError(f"{what}: {why}\n{self.logs()}")
            time.sleep(every)

    def wait(self, procs: Sequence[subprocess.Popen], timeout: float) -> list[int]:
        """Exit codes of ``procs``; TimeoutError (with every log's tail) if one runs past ``timeout``."""
        deadline = time.monotonic() + timeout
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired as err:
                raise TimeoutError(f"{proc.args!r} still running after {timeout:g} s\n{self.logs()}") from err
        return codes

    # -- what the run left -------------------------------------------------------------------------------
    def step_metrics(self) -> list[dict]:
        """The trainer's records of trained steps (``[logging].output_dir/metrics.jsonl``)."""
        lines = (self.workdir / "out" / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if "train/loss" in r]

    def checkpoint_state(self) -> dict:
        """The latest checkpoint's ``trainer_state.json``."""
        ckpt = self.workdir / "ckpt"
        latest = json.loads((ckpt / "latest.json").read_text())
        return json.loads((ckpt / latest["path"] / "trainer_state.json").read_text())

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def logs(self, tail: int = 3000) -> str:
        """The end of every role's log, for a failure message."""
        return "\n".join(f"== {name}\n{self.log(name)[-tail:]}" for name in self.procs)

    def call(self, host: str, fn: Callable[..., T], *args: object, timeout: float = 30.0) -> T:
        return self.net.call(host, fn, *args, timeout=timeout)


def policy_version(url: str, token: str, timeout: float = 5.0) -> int:
    """The policy version ``url``'s server serves (``GET /policy_version``)."""
    import httpx

    reply = httpx.get(url + "/policy_version", headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
    reply.raise_for_status()
    return int(reply.json()["policy_version"])


def _health(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping())
    except redis.ConnectionError:
        return False
