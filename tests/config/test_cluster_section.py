"""``[cluster]``: the hosts of a multi-host run, checked when the config is read."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ludic.config.schema import RunConfig

GOOD = {"servers": ["http://10.0.0.5:8000", "http://10.0.0.6:8000"], "redis_url": "redis://10.0.0.2:6379/0"}


def run_config(**cluster: object) -> RunConfig:
    return RunConfig.model_validate({"model": {"path": "m"}, "env": {"name": "e"}, "cluster": {**GOOD, **cluster}})


def test_a_cluster_names_its_hosts_and_counts_the_trainer_processes() -> None:
    cfg = run_config(trainer_nodes=2, trainer_procs_per_node=4, master_addr="10.0.0.1")
    assert cfg.cluster is not None
    assert cfg.cluster.servers == GOOD["servers"]
    assert cfg.cluster.trainer_world_size == 8
    assert RunConfig.model_validate({"model": {"path": "m"}, "env": {"name": "e"}}).cluster is None


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"servers": []}, "servers is empty"),
        ({"servers": ["10.0.0.5:8000"]}, "servers[0]"),
        ({"servers": ["http://a:1", "http://a:1"]}, "one server twice"),
        ({"redis_url": ""}, "redis_url is empty"),
        ({"redis_url": "http://10.0.0.2:6379"}, "redis_url"),
        ({"redis_url": "redis://:secret@10.0.0.2:6379/0"}, "redis_password_env"),
        ({"master_port": 0}, "master_port"),
        ({"trainer_nodes": 0}, "trainer_nodes"),
        ({"actor_tasks": 0}, "actor_tasks"),
        ({"api_key_env": "not a name"}, "api_key_env"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_a_wrong_cluster_table_is_refused_naming_the_key(override: dict, named: str) -> None:
    with pytest.raises(ValidationError, match=named.replace("[", r"\[").replace("]", r"\]")):
        run_config(**override)
