"""``[cluster.slurm]`` and ``[cluster.kubernetes]``: what ``ludic cluster render`` needs beyond ``[cluster]``.

Every value here lands in a rendered recipe: a ``#SBATCH`` line or a manifest field. Slurm does not honour
shell quoting on ``#SBATCH`` lines and Kubernetes refuses names outside its DNS rules, so each value is
checked against the characters its destination accepts when the config is read: a value with a space or a
quote is refused naming the key, never written where it would be read as something else. ``setup`` alone is
shell by design (``source .venv/bin/activate``).
"""

from __future__ import annotations

import re

from pydantic import model_validator

from ludic.config.section_base import Section, _at_least

_SLURM_WORD = re.compile(r"[A-Za-z0-9_.,:@+-]+")
"""Partitions, accounts, QOS names: what an ``#SBATCH --opt=VALUE`` line carries without quoting."""
_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}")
"""Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
"""A Kubernetes object name (RFC 1123 label): namespaces, Secrets, claims, the name prefix."""
_QUANTITY = re.compile(r"\d+(\.\d+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
"""A Kubernetes resource quantity (``500m``, ``8``, ``32Gi``)."""
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")
"""A container image reference (``ghcr.io/org/ludic:0.1``, ``redis:7.2``)."""
_PATH = re.compile(r"/[A-Za-z0-9_./-]*")


def _match(
    section: Section, pattern: re.Pattern[str], what: str, *names: str, empty_ok: bool = False
) -> None:
    for name in names:
        value = getattr(section, name)
        if value == "" and empty_ok:
            continue
        if not pattern.fullmatch(value):
            raise ValueError(f"{name} = {value!r} is not {what}")


class SlurmSection(Section):
    """``[cluster.slurm]``: the batch job ``ludic cluster render CONFIG --slurm OUT`` writes (docs/cluster.md).

    The job is heterogeneous, one component per role (Redis, servers, trainer, actors), so each role gets
    its own nodes and resources; the roles' addresses come from the nodes Slurm allocates."""

    job_name: str = "ludic"
    """The job's name (``#SBATCH --job-name``)."""
    partition: str = ""
    """The partition of every component (empty: the cluster's default)."""
    account: str = ""
    """The account charged (empty: your default)."""
    time_limit: str = "04:00:00"
    """The job's time limit in Slurm's format (``HH:MM:SS``, ``D-HH:MM:SS``, minutes)."""
    gpus_per_node: int = 1
    """GPUs on each server and trainer node (0: none); Redis and actor nodes get none."""
    cpus_per_task: int = 8
    """CPUs of each role's task (one task per node)."""
    setup: str = ""
    """A shell line run once at the top of the job, before any role starts (``module load cuda;
    source .venv/bin/activate``); its environment reaches every role. The only value written as shell."""
    redis_server: str = "redis-server"
    """The ``redis-server`` binary on the Redis node (a path, or a name on the PATH after ``setup``)."""
    redis_dir: str = "ludic-redis"
    """Redis's append-only data directory, relative to the job's working directory (shared storage, so a
    resubmitted job finds its stream)."""
    ready_timeout_s: int = 900
    """How long the job waits for Redis and each server to accept connections before it gives up, naming
    the one that did not come up."""

    @model_validator(mode="after")
    def _check(self) -> SlurmSection:
        _match(self, _SLURM_WORD, "a Slurm name (letters, digits, _ . , : @ + -)", "job_name")
        _match(self, _SLURM_WORD, "a Slurm name (letters, digits, _ . , : @ + -)", "partition", "account",
               empty_ok=True)  # fmt: skip
        _match(self, _SLURM_TIME, "a Slurm time limit (e.g. '04:00:00' or '1-12:00:00')", "time_limit")
        _at_least(self, 0, "gpus_per_node")
        _at_least(self, 1, "cpus_per_task", "ready_timeout_s")
        if "\n" in self.setup or "\r" in self.setup:
            raise ValueError("setup must be one line (join commands with ';')")
        for name in ("redis_server", "redis_dir"):
            if not getattr(self, name) or "\n" in getattr(self, name):
                raise ValueError(f"{name} must be a non-empty single-line path, got {getattr(self, name)!r}")
        return self


class KubernetesSection(Section):
    """``[cluster.kubernetes]``: the manifests ``ludic cluster render CONFIG --kubernetes DIR`` writes."""

    namespace: str = "ludic"
    """The namespace of every object (create it first: ``kubectl create namespace ludic``)."""
    name_prefix: str = "ludic"
    """The start of every object's name (``ludic-redis``, ``ludic-server-0``, ``ludic-trainer``, ...)."""
    image: str = "ludic:latest"
    """The container image of the Ludic roles (servers, trainer, actors): Ludic and its extras installed."""
    redis_image: str = "redis:7.2"
    """The Redis container image."""
    secret_name: str = "ludic-tokens"
    """The Secret holding the tokens, one key per variable named by ``api_key_env`` and
    ``redis_password_env`` (``kubectl create secret generic ludic-tokens --from-literal=LUDIC_API_KEY=...``)."""
    cpu: str = "8"
    """CPU of each server and trainer pod (request and limit)."""
    memory: str = "64Gi"
    """Memory of each server and trainer pod."""
    gpus: int = 1
    """``nvidia.com/gpu`` of each server and trainer pod (0: none)."""
    actor_cpu: str = "2"
    """CPU of each actor pod."""
    actor_memory: str = "8Gi"
    """Memory of each actor pod."""
    redis_memory: str = "4Gi"
    """Memory of the Redis pod."""
    volume_claim: str = ""
    """A PersistentVolumeClaim (ReadWriteMany) mounted at ``volume_path`` in every Ludic pod: the model and
    the run's output directory (empty: none, the image holds the model and outputs are lost with the pod).
    Redis keeps its data under its ``redis`` sub-folder."""
    volume_path: str = "/data"
    """Where ``volume_claim`` is mounted; paths in the config should point under it."""

    @model_validator(mode="after")
    def _check(self) -> KubernetesSection:
        dns = "a Kubernetes name (lower-case letters, digits and '-', at most 63)"
        _match(self, _DNS_LABEL, dns, "namespace", "secret_name")
        _match(self, _DNS_LABEL, dns, "volume_claim", empty_ok=True)
        _match(self, _DNS_LABEL, dns, "name_prefix")
        if len(self.name_prefix) > 40:  # room for "-server-NN" and the pods' own suffixes
            raise ValueError(f"name_prefix = {self.name_prefix!r} is longer than 40 characters")
        _match(self, _IMAGE, "a container image reference", "image", "redis_image")
        _match(self, _QUANTITY, "a Kubernetes quantity (e.g. '8', '500m', '64Gi')",
               "cpu", "memory", "actor_cpu", "actor_memory", "redis_memory")  # fmt: skip
        _match(self, _PATH, "an absolute path (letters, digits, _ . / -)", "volume_path")
        _at_least(self, 0, "gpus")
        return self
