"""The Kubernetes recipe: manifests for the four roles, one file per role (``kubectl apply -f DIR``).

- the config itself as a ConfigMap, mounted read-only at ``/etc/ludic`` in every Ludic pod;
- Redis: a Deployment (one replica, ``Recreate``: one writer of the append-only file) and a Service;
- each inference server: a Deployment and a Service of its own, so an actor's episode stays on one server;
- the trainer: an Indexed Job of ``trainer_nodes`` pods behind a headless Service, whose DNS names
  (``<prefix>-trainer-0.<prefix>-trainer``) give torchrun's c10d rendezvous its first host;
- the actors: a StatefulSet of ``actor_hosts`` replicas. Not a Deployment: its pods are interchangeable and
  would all play the same env seeds, while a StatefulSet's pod ordinal gives each ``--actor-id`` its own.

Tokens reach the pods only as environment variables from the Secret ``secret_name`` (``secretKeyRef``, the
key named like the variable); no manifest holds a token. Actors and the trainer get the Services' names
with ``--set cluster.<key>=...``; the config's ports are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ludic.cluster.recipes.roles import (
    actor_argv,
    address_overrides,
    redis_endpoint,
    redis_script,
    server_argv,
    server_endpoints,
    shell_join,
    trainer_argv,
)
from ludic.config.cluster_section import ClusterSection


def _literal(argv: list[str]) -> list[str]:
    """``argv`` as Kubernetes passes it on: it expands ``$(VAR)`` in commands and reads ``$$`` as ``$``, so
    every ``$`` is doubled and the container receives exactly ``argv`` (shell variables included)."""
    return [a.replace("$", "$$") for a in argv]


CONFIG_DIR = "/etc/ludic"
"""Where the ConfigMap holding the config is mounted in every Ludic pod."""


class _Manifests:
    """Builds the objects of one render; ``config_name``: the config's file name (its suffix picks the reader)."""

    def __init__(self, cluster: ClusterSection, config_name: str, config_text: str) -> None:
        self.c, self.k = cluster, cluster.kubernetes
        self.p = self.k.name_prefix
        self.config_key = "config" + Path(config_name).suffix.lower()
        self.config_text = config_text
        self.config = f"{CONFIG_DIR}/{self.config_key}"

    def meta(self, name: str, component: str) -> dict[str, Any]:
        return {"name": name, "namespace": self.k.namespace, "labels": self.labels(component)}

    def labels(self, component: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": "ludic", "app.kubernetes.io/instance": self.p,
                "app.kubernetes.io/component": component}  # fmt: skip

    def env(self, *names: str) -> list[dict[str, Any]]:
        ref = {"name": self.k.secret_name}
        return [{"name": n, "valueFrom": {"secretKeyRef": {**ref, "key": n}}} for n in names]

    def service(
        self, name: str, component: str, port: int | None, *, headless: bool = False
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {"selector": self.labels(component)}
        if port is not None:
            spec["ports"] = [{"name": "main", "port": port, "targetPort": port}]
        if headless:  # DNS names for the pods themselves, before they are ready (the rendezvous needs them)
            spec |= {"clusterIP": "None", "publishNotReadyAddresses": True}
        return {"apiVersion": "v1", "kind": "Service", "metadata": self.meta(name, component), "spec": spec}

    def resources(self, *, gpu_role: bool) -> dict[str, Any]:
        k = self.k
        amounts: dict[str, Any] = {"cpu": k.cpu, "memory": k.memory} if gpu_role else {
            "cpu": k.actor_cpu, "memory": k.actor_memory}  # fmt: skip
        if gpu_role and k.gpus:
            amounts["nvidia.com/gpu"] = k.gpus
        return {"requests": dict(amounts), "limits": dict(amounts)}

    def ludic_pod(self, component: str, container: dict[str, Any], *, gpu_role: bool) -> dict[str, Any]:
        """A pod template running Ludic's image with the config, the volume and /dev/shm mounted."""
        mounts = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
        volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": f"{self.p}-config"}}]
        if self.k.volume_claim:
            mounts.append({"name": "data", "mountPath": self.k.volume_path})
            volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": self.k.volume_claim}})
        if gpu_role:  # torch's worker processes and NCCL share memory through /dev/shm (64 MiB by default)
            mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
            volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        full = {"name": container["name"], "image": self.k.image, **container,
                "resources": self.resources(gpu_role=gpu_role), "volumeMounts": mounts}  # fmt: skip
        return {
            "metadata": {"labels": self.labels(component)},
            "spec": {"containers": [full], "volumes": volumes},
        }

    def config_map(self) -> list[dict[str, Any]]:
        return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": self.meta(f"{self.p}-config", "config"),
                 "data": {self.config_key: self.config_text}}]  # fmt: skip

    def redis(self) -> list[dict[str, Any]]:
        port, name = redis_endpoint(self.c).port, f"{self.p}-redis"
        script = redis_script(self.c, binary="redis-server", data_dir="/data")
        container = {"name": "redis", "image": self.k.redis_image, "command": _literal(["sh", "-c", script]),
                     "env": self.env(self.c.redis_password_env), "ports": [{"containerPort": port}],
                     "resources": {"requests": {"memory": self.k.redis_memory}, "limits": {"memory": self.k.redis_memory}},
                     "volumeMounts": [{"name": "data", "mountPath": "/data"}]}  # fmt: skip
        if self.k.volume_claim:
            container["volumeMounts"][0]["subPath"] = "redis"
            volume = {"name": "data", "persistentVolumeClaim": {"claimName": self.k.volume_claim}}
        else:
            volume = {"name": "data", "emptyDir": {}}
        pod = {
            "metadata": {"labels": self.labels("redis")},
            "spec": {"containers": [container], "volumes": [volume]},
        }
        spec = {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": self.labels("redis")},
                "template": pod}  # fmt: skip
        return [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": self.meta(name, "redis"), "spec": spec},
                self.service(name, "redis", port)]  # fmt: skip

    def servers(self) -> list[dict[str, Any]]:
        out = []
        for i, e in enumerate(server_endpoints(self.c)):
            name = component = f"{self.p}-server-{i}"
            container = {"name": "server", "command": _literal(server_argv(self.config, e.port)),
                         "env": self.env(self.c.api_key_env), "ports": [{"containerPort": e.port}],
                         "readinessProbe": {"httpGet": {"path": "/health", "port": e.port}, "periodSeconds": 5}}  # fmt: skip
            spec = {"replicas": 1, "selector": {"matchLabels": self.labels(component)},
                    "template": self.ludic_pod(component, container, gpu_role=True)}  # fmt: skip
            out += [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": self.meta(name, component),
                     "spec": spec}, self.service(name, component, e.port)]  # fmt: skip
        return out

    def overrides(self) -> list[str]:
        hosts = [f"{self.p}-server-{i}" for i in range(len(self.c.servers))]
        return address_overrides(self.c, redis_host=f"{self.p}-redis", server_hosts=hosts,
                                 master_host=f"{self.p}-trainer-0.{self.p}-trainer")  # fmt: skip

    def trainer(self) -> list[dict[str, Any]]:
        name, n = f"{self.p}-trainer", self.c.trainer_nodes
        argv = trainer_argv(self.c, self.config, rdzv_host=f"{name}-0.{name}", rdzv_id=name)
        container = {"name": "trainer", "command": _literal([*argv, *self.overrides()]),
                     "env": self.env(self.c.api_key_env, self.c.redis_password_env),
                     "ports": [{"containerPort": self.c.master_port}]}  # fmt: skip
        pod = self.ludic_pod("trainer", container, gpu_role=True)
        pod["spec"] |= {"subdomain": name, "restartPolicy": "Never"}  # pod i is <name>-i.<name>
        spec = {
            "completionMode": "Indexed",
            "completions": n,
            "parallelism": n,
            "backoffLimit": 0,
            "template": pod,
        }
        return [self.service(name, "trainer", self.c.master_port, headless=True),
                {"apiVersion": "batch/v1", "kind": "Job", "metadata": self.meta(name, "trainer"), "spec": spec}]  # fmt: skip

    def actors(self) -> list[dict[str, Any]]:
        name = f"{self.p}-actor"
        # the pod's ordinal (<name>-3 -> 3) is its actor id: each replica plays its own env seeds
        line = shell_join([*actor_argv(self.config, "@ID@"), *self.overrides()])
        script = "exec " + line.replace("@ID@", '"${HOSTNAME##*-}"')
        container = {"name": "actor", "command": _literal(["sh", "-c", script]),
                     "env": self.env(self.c.api_key_env, self.c.redis_password_env)}  # fmt: skip
        spec = {"replicas": self.c.actor_hosts, "serviceName": name, "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": self.labels("actor")},
                "template": self.ludic_pod("actor", container, gpu_role=False)}  # fmt: skip
        return [self.service(name, "actor", None, headless=True),
                {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": self.meta(name, "actor"), "spec": spec}]  # fmt: skip


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe emitter, writing multi-line strings (the scripts) as literal blocks."""


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _string)

FILES = ("00-config.yaml", "10-redis.yaml", "20-servers.yaml", "30-trainer.yaml", "40-actors.yaml")


def render_kubernetes(cluster: ClusterSection, config_name: str, config_text: str) -> dict[str, str]:
    """File name -> YAML text of each manifest file, in ``kubectl apply`` order."""
    m = _Manifests(cluster, config_name, config_text)
    docs = (m.config_map(), m.redis(), m.servers(), m.trainer(), m.actors())
    return {f: yaml.dump_all(d, Dumper=_Dumper, sort_keys=False, width=120) for f, d in zip(FILES, docs)}
