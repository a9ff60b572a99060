"""A multi-host run with each role in a simulated host of its own, started with its documented command:
Redis, ``ludic serve`` (bearer token), ``ludic actor`` and ``torchrun ... ludic train`` ranks (gloo across
hosts), talking only over the addresses the network gave them. The full layout is slow; a short form (one host
per role) runs in the default suite."""

from __future__ import annotations

import pytest

from ludic.testing.netns_roles import policy_version

TABLES = """
[trainer]
lr = 1e-3
max_seq_len = 128
micro_token_budget = 1024
[pipeline]
max_staleness = 2
run_id = "netns"
"""


@pytest.mark.slow  # every role in its own host: ~20 s
def test_short_run_with_redis_server_actor_and_trainer_on_hosts_of_their_own(cluster) -> None:
    run = cluster(["redis", "server0", "actor0", "trainer0"])
    config = run.write_config(steps=2, server_hosts=["server0"], redis_host="redis", trainer_hosts=["trainer0"],
                              tables=TABLES)  # fmt: skip
    server = run.start_server("server0", config, wait=False)  # the hosts start side by side
    run.start_redis("redis")
    trainers = run.start_trainers(["trainer0"], config, "--fresh")
    run.wait_server("actor0", server)
    run.start_actor("actor0", config, 0)
    assert run.wait(trainers, timeout=240) == [0], run.logs()
    assert [r["step"] for r in run.step_metrics()] == [1, 2]
    assert run.call("actor0", policy_version, server, run.token) == 2  # published across hosts


@pytest.mark.slow
def test_two_trainer_hosts_two_servers_two_actors_train_and_publish_to_every_server(cluster) -> None:
    run = cluster(["redis", "server0", "server1", "actor0", "actor1", "trainer0", "trainer1"])
    config = run.write_config(steps=3, server_hosts=["server0", "server1"], redis_host="redis",
                              trainer_hosts=["trainer0", "trainer1"], tables=TABLES)  # fmt: skip
    servers = [run.start_server(h, config, wait=False) for h in ("server0", "server1")]
    run.start_redis("redis")
    trainers = run.start_trainers(["trainer0", "trainer1"], config, "--fresh")
    for url in servers:
        run.wait_server("actor0", url)
    run.start_actor("actor0", config, 0)
    run.start_actor("actor1", config, 1)
    assert run.wait(trainers, timeout=500) == [0, 0], run.logs()
    steps = run.step_metrics()
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:  # FSDP2 across the two trainer hosts: both ranks trained a share of every step
        assert r["perf/rank0/real_tokens"] > 0 and r["perf/rank1/real_tokens"] > 0
        assert r["perf/publish_servers_ok"] == 2.0
    for url in servers:
        assert run.call("actor1", policy_version, url, run.token) == 3
    state = run.checkpoint_state()
    assert (state["step"], state["world_size"]) == (3, 2)
    for host in ("actor0", "actor1"):  # both actor hosts pushed batches
        assert "pushed" in run.log(f"actor-{host}"), run.logs()


def _wait_fraction(run, actors: int, steps: int) -> float:
    """The trainer's mean share of step time spent waiting for data, with ``actors`` actor hosts."""
    hosts = [f"actor{i}" for i in range(actors)]
    config = run.write_config(steps=steps, server_hosts=["server0"], redis_host="redis", trainer_hosts=["trainer0"],
                              tables=TABLES)  # fmt: skip
    server = run.start_server("server0", config, wait=False)
    run.start_redis("redis")
    trainers = run.start_trainers(["trainer0"], config, "--fresh")
    run.wait_server("trainer0", server)
    for i, host in enumerate(hosts):
        run.start_actor(host, config, i)
    assert run.wait(trainers, timeout=400) == [0], run.logs()
    fractions = [
        r["perf/wait_fraction"] for r in run.step_metrics()[1:]
    ]  # step 1 waits for the actors to start
    assert len(fractions) == steps - 1 and all(0.0 <= f <= 1.0 for f in fractions)
    return sum(fractions) / len(fractions)


@pytest.mark.slow
@pytest.mark.parametrize("actors", [1, 2])
def test_the_trainers_wait_for_data_is_measured_with_one_and_two_actor_hosts(cluster, actors: int) -> None:
    """Overlap in the network: perf/wait_fraction per step (a figure for docs, re-measured on a quiet machine;
    the test checks it is measured, not its value)."""
    run = cluster(["redis", "server0", "trainer0", *[f"actor{i}" for i in range(actors)]])
    fraction = _wait_fraction(run, actors, steps=6)
    print(f"{actors} actor host(s): trainer waited for data {fraction:.2%} of its step time")
