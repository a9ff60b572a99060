"""Each role's command, as both recipes start it (docs/cluster.md, "The four roles").

A recipe places the roles on hosts it only learns when the job runs (Slurm's nodes) or names itself
(Kubernetes Services), so the actors and the trainer get the addresses with ``--set cluster.<key>=...``
while the config's ports, schemes and paths stay as written. Hosts enter these helpers as placeholders;
everything else is checked against a small alphabet here, so no config value can end a quoted string in
the TOML of ``--set`` or in the shell that carries it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit

from ludic.config.cluster_section import ClusterSection

_TAIL = re.compile(r"[A-Za-z0-9_./=&?%-]*")
"""What may follow ``host:port`` in a URL the recipes rewrite (``/0``, ``/v1``, ``?socket_timeout=5``)."""


class RecipeError(ValueError):
    """A config the recipes cannot render, with the key and the reason."""


@dataclass(frozen=True)
class Endpoint:
    """A URL of ``[cluster]`` with its host taken out: ``scheme://HOST:port tail``."""

    scheme: str
    port: int
    tail: str

    def with_host(self, host: str) -> str:
        return f"{self.scheme}://{host}:{self.port}{self.tail}"


def endpoint(url: str, what: str) -> Endpoint:
    """``url``'s scheme, port (the scheme's default when absent) and path/query, checked for the recipes."""
    parts = urlsplit(url)
    default = {"http": 80, "https": 443, "redis": 6379, "rediss": 6379}[parts.scheme]
    tail = parts.path + (f"?{parts.query}" if parts.query else "")
    if parts.fragment or parts.username or not _TAIL.fullmatch(tail):
        raise RecipeError(f"{what} {url!r}: the recipes rewrite its host and keep the rest, which may only be "
                          "a port and a plain path or query (letters, digits, _ . / = & ? % -)")  # fmt: skip
    return Endpoint(parts.scheme, parts.port or default, tail)


def server_endpoints(cluster: ClusterSection) -> list[Endpoint]:
    return [endpoint(url, f"[cluster].servers[{i}]") for i, url in enumerate(cluster.servers)]


def redis_endpoint(cluster: ClusterSection) -> Endpoint:
    return endpoint(cluster.redis_url, "[cluster].redis_url")


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def address_overrides(
    cluster: ClusterSection, *, redis_host: str, server_hosts: list[str], master_host: str
) -> list[str]:
    """The ``--set`` arguments that point the actors and the trainer at the hosts the recipe placed."""
    servers = ", ".join(toml_string(e.with_host(h)) for e, h in zip(server_endpoints(cluster), server_hosts))
    return [
        "--set", f"cluster.redis_url={toml_string(redis_endpoint(cluster).with_host(redis_host))}",
        "--set", f"cluster.servers=[{servers}]",
        "--set", f"cluster.master_addr={toml_string(master_host)}",
    ]  # fmt: skip


def server_argv(config: str, port: int) -> list[str]:
    """One inference server: Ludic's server on ``[model]``, every interface, the token from ``api_key_env``."""
    return ["ludic", "serve", config, "--host", "0.0.0.0", "--port", str(port)]


def actor_argv(config: str, actor_id: str) -> list[str]:
    """One actor host; ``actor_id`` picks its stretch of env seeds (0, 1, ... across hosts)."""
    return ["ludic", "actor", config, "--actor-id", actor_id]


def trainer_argv(cluster: ClusterSection, config: str, *, rdzv_host: str, rdzv_id: str) -> list[str]:
    """One trainer host's torchrun; c10d rendezvous on the first trainer host assigns the ranks."""
    return [
        "torchrun", f"--nnodes={cluster.trainer_nodes}", f"--nproc_per_node={cluster.trainer_procs_per_node}",
        "--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv_host}:{cluster.master_port}", f"--rdzv_id={rdzv_id}",
        "-m", "ludic.cli", "train", config,
    ]  # fmt: skip


REDIS_SCRIPT = """\
: "${PASSWORD_ENV:?is not set: export the Redis password in it}"
pw=$(printf '%s' "${PASSWORD_ENV}" | sed 's/[\\\\"]/\\\\&/g')
mkdir -p {data_dir}
exec {binary} - --port {port} --bind 0.0.0.0 --appendonly yes --dir {data_dir} <<EOF
requirepass "$pw"
EOF
"""


def redis_script(cluster: ClusterSection, *, binary: str, data_dir: str) -> str:
    """A POSIX ``sh`` script starting Redis with ``requirepass`` from ``redis_password_env``.

    The password goes in through stdin as a config line (quoted in Redis's own syntax), so it never sits
    on a command line (``ps``), in a file or in the rendered recipe. ``exec`` leaves Redis as the process the
    launcher signals, so a stop saves the append-only file."""
    return (
        REDIS_SCRIPT.replace("PASSWORD_ENV", cluster.redis_password_env)
        .replace("{binary}", shlex.quote(binary))
        .replace("{data_dir}", shlex.quote(data_dir))
        .replace("{port}", str(redis_endpoint(cluster).port))
    )


def shell_join(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
