"""``[cluster]``: where each role of a multi-host run lives (a table of the run config, ``ludic.config.schema``).

A run over several hosts has four roles, each started with one command on its own host (docs/cluster.md):
the trainer (``torchrun ... ludic train CONFIG``), actors (``ludic actor CONFIG``), inference servers
(``ludic serve CONFIG``) and Redis. This table names their addresses and where their secrets come from;
the same config file goes to every host, and only the launch command differs. Secrets never sit in the
file: ``api_key_env`` and ``redis_password_env`` name environment variables each role reads.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from ludic.config.launch_section import KubernetesSection, SlurmSection
from ludic.config.section_base import Section, _at_least


def _check_url(url: str, schemes: tuple[str, ...], what: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError(f"{what} {url!r} is not a {' or '.join(s + '://' for s in schemes)}HOST[:PORT] URL")
    if parts.password:
        raise ValueError(f"{what} {url!r} holds a password: put it in the environment variable named by "
                         "redis_password_env instead of the config file")  # fmt: skip


class ClusterSection(Section):
    """``[cluster]``: the hosts of a multi-host run (docs/cluster.md). Setting it puts ``ludic train`` in
    pipeline mode with actors started on their own (``ludic actor``) and weights published to ``servers``."""

    servers: list[str] = Field(default_factory=list)
    """The inference servers' base URLs (``http://10.0.0.5:8000``). Actors spread episodes over them, each
    multi-turn episode on one server; the trainer publishes every step's weights to each of them."""
    redis_url: str = ""
    """The Redis host (``redis://10.0.0.2:6379/0``), without a password (see ``redis_password_env``)."""
    api_key_env: str = "LUDIC_API_KEY"
    """The environment variable holding the servers' bearer token: ``ludic serve`` requires it on every
    route but ``/health``; the trainer and actors send it."""
    redis_password_env: str = "LUDIC_REDIS_PASSWORD"
    """The environment variable holding Redis's password (empty or unset: no password)."""
    trainer_nodes: int = 1
    """Hosts of the trainer (``torchrun --nnodes``); FSDP2 shards across all their processes."""
    trainer_procs_per_node: int = 1
    """Trainer processes per host (``torchrun --nproc_per_node``)."""
    master_addr: str = "127.0.0.1"
    """The trainer's rendezvous host (``torchrun --master_addr``; the first trainer host)."""
    master_port: int = 29500
    """The trainer's rendezvous port."""
    actor_hosts: int = 1
    """Actor hosts the launch recipes start (each runs ``ludic actor``)."""
    actor_tasks: int = 1
    """Actor tasks per ``ludic actor`` process, each on its own stretch of env seeds."""
    publish_failure: Literal["skip", "stop"] = "skip"
    """When a server misses a weight publish (error, or no answer within the bound; the error names the server,
    the operation and the wait): "skip" goes on (that server keeps serving its last complete version and the
    next publish, full weights again, brings it up to date; every server missing it still stops the run),
    "stop" stops the run (``ludic.distributed.fanout``)."""
    slurm: SlurmSection = Field(default_factory=SlurmSection)
    """The batch job ``ludic cluster render CONFIG --slurm OUT`` writes."""
    kubernetes: KubernetesSection = Field(default_factory=KubernetesSection)
    """The manifests ``ludic cluster render CONFIG --kubernetes DIR`` writes."""

    @model_validator(mode="after")
    def _check(self) -> ClusterSection:
        _at_least(self, 1, "trainer_nodes", "trainer_procs_per_node", "actor_hosts", "actor_tasks")
        if not self.servers:
            raise ValueError('servers is empty: name the inference servers, e.g. ["http://10.0.0.5:8000"]')
        for i, url in enumerate(self.servers):
            _check_url(url, ("http", "https"), f"servers[{i}]")
        if len(set(self.servers)) != len(self.servers):
            raise ValueError(f"servers names one server twice: {self.servers}")
        if not self.redis_url:
            raise ValueError("redis_url is empty: name the Redis host, e.g. 'redis://10.0.0.2:6379/0'")
        _check_url(self.redis_url, ("redis", "rediss"), "redis_url")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be in 1..65535, got {self.master_port}")
        for name in ("api_key_env", "redis_password_env"):
            value = getattr(self, name)
            if not value.isidentifier():
                raise ValueError(f"{name} must name an environment variable, got {value!r}")
        return self

    @property
    def trainer_world_size(self) -> int:
        """Trainer processes in all."""
        return self.trainer_nodes * self.trainer_procs_per_node
