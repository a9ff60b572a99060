"""Faults of a multi-host run in simulated hosts, one test each, each asserting the promise docs/cluster.md
makes for it: a trainer<->server link cut during publishes, a slow lossy link, an actor host killed
mid-episode, a server killed mid-generation, an actor host joining mid-run, a trainer host losing power or
its rank killed, then the resume on fewer hosts. Every role runs its documented
command (``ludic serve``, ``ludic actor``, ``torchrun ... ludic train``) in a host of its own."""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter

import pytest

from ludic.testing.netns_commands import namespace_pids
from ludic.testing.netns_roles import SimulatedCluster, policy_version

RUN_ID = "faults"
TABLES = f"""
[trainer]
lr = 1e-3
max_seq_len = 128
micro_token_budget = 1024
[pipeline]
max_staleness = 2
run_id = "{RUN_ID}"
"""
BATCH = 4  # prompts_per_step x group_size of tiny_run_toml
GROUP = 2


def served_version_at_least(run: SimulatedCluster, host: str, url: str, version: int, timeout: float) -> None:
    def ready() -> bool:
        try:
            return policy_version(url, run.token, timeout=2) >= version
        except OSError:
            return False

    run.wait_for(f"{url} serving version {version}", host, ready, timeout=timeout)


def wait_log(run: SimulatedCluster, name: str, pattern: str, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while not (match := re.search(pattern, run.log(name))):
        assert time.monotonic() < deadline, (
            f"{pattern!r} not in {name}'s log after {timeout:g} s\n{run.logs()}"
        )
        time.sleep(0.2)
    return match


def stream_state(url: str, password: str) -> tuple[dict[str, int], list]:
    """The run's counters and every entry still in its stream, decoded (called from a host of the network)."""
    import redis

    from ludic.training.pipeline.codec import decode_entry

    r = redis.Redis.from_url(url.replace("redis://", f"redis://:{password}@"), socket_timeout=5)
    prefix = f"ludic:pipeline:{RUN_ID}"
    pushed, consumed = (int(v or 0) for v in r.mget(f"{prefix}:pushed", f"{prefix}:consumed"))
    entries = [decode_entry(fields, run_id=RUN_ID) for _, fields in r.xrange(f"{prefix}:items")]
    return {"pushed": pushed, "consumed": consumed}, entries


def start(run: SimulatedCluster, *, steps: int, servers: list[str], tables: str = "") -> tuple[object, list]:
    """Redis on "redis", ``ludic serve`` on each of ``servers``, the trainer on "trainer0"; (config, trainers)."""
    config = run.write_config(steps=steps, server_hosts=servers, redis_host="redis", trainer_hosts=["trainer0"],
                              tables=TABLES + tables)  # fmt: skip
    urls = [run.start_server(h, config, wait=False) for h in servers]
    run.start_redis("redis")
    trainers = run.start_trainers(["trainer0"], config, "--fresh")
    for url in urls:
        run.wait_server("trainer0", url)
    return config, trainers


def assert_every_step_trained_whole(run: SimulatedCluster, steps: int) -> list[dict]:
    records = run.step_metrics()
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(r["train/num_samples"] == BATCH for r in records), records
    return records


@pytest.mark.slow
def test_a_cut_trainer_server_link_fails_the_publish_within_its_bound_and_a_later_publish_catches_up(
    cluster,
) -> None:
    run = cluster(["redis", "server0", "server1", "actor0", "trainer0"])
    bound, steps = 3.0, 16
    config, trainers = start(run, steps=steps, servers=["server0", "server1"],
                             tables=f"[timeouts]\npublish_s = {bound}\n")  # fmt: skip
    s0, s1 = run.server_url("server0"), run.server_url("server1")
    # The actor samples from server0 only: server1 just receives the trainer's publishes.
    run.start_actor("actor0", config, 0, "--set", f'cluster.servers=["{s0}"]')
    served_version_at_least(run, "server1", s1, 1, timeout=240)
    run.net.link_down("server1")
    before = run.call("server1", policy_version, s1, run.token)  # asked from inside server1's own host
    failure = wait_log(run, "trainer-trainer0", rf"{re.escape(s1)}: (.+?) of version (\d+) failed after ([\d.]+) s",
                       timeout=120)  # fmt: skip
    assert "publish weights" in failure.group(1)  # the peer and the operation are named
    assert float(failure.group(3)) <= bound + 1.0  # and it ended within its bound
    assert (
        run.call("server1", policy_version, s1, run.token) == before
    )  # the last complete version, still served
    run.net.link_up("server1")
    assert run.wait(trainers, timeout=400) == [0], run.logs()
    assert run.call("trainer0", policy_version, s1, run.token) == steps  # a later publish caught it up
    assert run.call("trainer0", policy_version, s0, run.token) == steps
    records = assert_every_step_trained_whole(run, steps)
    assert any(r["perf/publish_servers_failed"] >= 1 for r in records)
    assert records[-1]["perf/publish_servers_ok"] == 2.0


@pytest.mark.slow
def test_a_slow_lossy_link_completes_the_run_and_the_step_time_split_shows_the_publish_wait(cluster) -> None:
    run = cluster(["redis", "server0", "actor0", "trainer0"])
    config, trainers = start(run, steps=3, servers=["server0"])
    run.net.netem("server0", delay_ms=100, loss_pct=1)  # everything server0 sends: replies and acks
    run.start_actor("actor0", config, 0)
    assert run.wait(trainers, timeout=400) == [0], run.logs()
    for r in assert_every_step_trained_whole(
        run, 3
    ):  # each publish waits >= one 100 ms round trip, and says so
        assert r["time/publish_seconds"] >= 0.1
        assert {"time/wait_seconds", "time/forward_backward_seconds", "time/step_seconds"} <= r.keys()
    assert re.search(r"time: wait [\d.]+s, .*publish [\d.]+s", run.log("trainer-trainer0"))
    assert run.call("trainer0", policy_version, run.server_url("server0"), run.token) == 3


@pytest.mark.slow
def test_an_actor_host_killed_mid_episode_leaves_the_others_going_and_nothing_half_or_twice_trained(
    cluster,
) -> None:
    """actor0's cable is narrow (frames of at most 300 bytes at 8 kbit/s), so a push (4 XADDs of ~700 bytes)
    crosses in pieces over seconds. Once Redis has taken the push's first XADD whole and holds part of the next,
    the cable is pulled and the host killed: Redis never hears the rest, nor a close. A push sent as loose
    commands would leave that first item, half of its group, in the stream (and the trainer would train it)."""
    run = cluster(["redis", "server0", "actor0", "actor1", "trainer0"])
    config, trainers = start(run, steps=6, servers=["server0"])
    # no segmentation offload: TCP hands the relay one MTU-sized frame at a time, 300 ms apart
    run.net.run("actor0", ["ip", "link", "set", "dev", "eth0", "mtu", "300", "gso_max_segs", "1"])
    run.net.netem("actor0", rate_kbit=8)
    run.start_actor("actor0", config, 0)
    run.start_actor("actor1", config, 1)
    redis_url, actor0 = run.redis_url("redis"), run.net.address("actor0")

    def mid_push() -> list[dict]:  # actor0's connection after one whole XADD of a push, part of the next in
        clients = run.call("redis", clients_of, redis_url, run.redis_password, actor0)
        return [c for c in clients if c["cmd"] in ("xadd", "incrby") and int(c["qbuf"]) > 0]

    deadline = time.monotonic() + 240
    while not mid_push():
        assert time.monotonic() < deadline, f"no push of actor0 reached Redis in 240 s\n{run.logs()}"
        time.sleep(0.02)
    run.net.link_down("actor0")  # the rest of the push is lost with the cable, then the host goes
    run.net.kill_host("actor0")
    assert mid_push(), "the cut did not land inside a push"  # Redis still holds a push's unfinished part
    _, entries = run.call("redis", stream_state, redis_url, run.redis_password)
    assert_whole_groups_once(entries)  # before the trainer reads (and a checkpoint trims) anything pushed
    assert run.wait(trainers, timeout=400) == [0], run.logs()
    records = assert_every_step_trained_whole(run, 6)  # actor1 alone fed the rest of the run
    counts, entries = run.call("redis", stream_state, redis_url, run.redis_password)
    assert_whole_groups_once(entries)
    assert counts["pushed"] % GROUP == 0, f"part of a group was pushed: {counts}"
    assert counts["consumed"] >= sum(r["train/num_samples"] for r in records)


def assert_whole_groups_once(entries: list) -> None:
    ids = [e.item_id for e in entries]
    assert len(ids) == len(set(ids)), "an item is in the stream twice"
    groups = Counter(e.item.meta["group_id"] for e in entries)
    assert all(n % GROUP == 0 for n in groups.values()), f"part of a group is in the stream: {groups}"


def clients_of(url: str, password: str, address: str) -> list[dict]:
    """Redis's CLIENT LIST entries of the connections from ``address`` (called from a host of the network)."""
    import redis

    r = redis.Redis.from_url(url.replace("redis://", f"redis://:{password}@"), socket_timeout=5)
    return [c for c in r.client_list() if c["addr"].rsplit(":", 1)[0] == address]


@pytest.mark.slow
def test_a_server_killed_mid_generation_moves_its_episodes_to_the_other_and_trains_none_half(cluster) -> None:
    """server1's replies cross a 2 s link, so each completion it answers is in flight for seconds; once one is
    (its reply to actor0 sent, not yet acknowledged), server1 loses power: cable pulled, host killed, the reply
    lost. actor0's call ends at its HTTP bound and the episode is played again, from its start, on server0: its
    group reaches the stream whole (without the replay the group is broken and left out)."""
    run = cluster(["redis", "server0", "server1", "actor0", "trainer0"])
    config = run.write_config(steps=6, server_hosts=["server0", "server1"], redis_host="redis",
                              trainer_hosts=["trainer0"], tables=TABLES + "[timeouts]\nhttp_s = 8\npublish_s = 3\n")  # fmt: skip
    s0, s1 = (run.start_server(h, config, wait=False) for h in ("server0", "server1"))
    run.start_redis("redis")
    # one checkpoint at the end: the stream keeps every entry (trimmed once a checkpoint covers it) until then
    trainers = run.start_trainers(["trainer0"], config, "--fresh", "--set", "checkpoint.every_n_steps=1000")
    for url in (s0, s1):
        run.wait_server("trainer0", url)
    run.net.netem("server1", delay_ms=2000)
    run.start_actor("actor0", config, 0)  # episodes spread over both servers
    actor0 = re.escape(run.net.address("actor0"))
    deadline = time.monotonic() + 240
    while not (open_reply := re.search(rf"ESTAB +0 +(\d{{4,}}) +\S+:{s1.rsplit(':', 1)[1]} +{actor0}:",
                                       run.net.run("server1", ["ss", "-tn"], timeout=10).stdout)):  # fmt: skip
        assert time.monotonic() < deadline, f"no completion of actor0's on server1 in 240 s\n{run.logs()}"
        time.sleep(0.1)  # a reply of >= 1000 bytes (a completion; a version is ~150) not yet acknowledged
    run.net.link_down("server1")
    run.net.kill_host("server1")
    seen: dict[str, str] = {}  # item id -> group id, of every entry the stream held while the run went on
    deadline = time.monotonic() + 400
    while trainers[0].poll() is None and time.monotonic() < deadline:
        _, entries = run.call("redis", stream_state, run.redis_url("redis"), run.redis_password)
        seen.update((e.item_id, e.item.meta["group_id"]) for e in entries)
        time.sleep(0.5)
    assert run.wait(trainers, timeout=10) == [0], run.logs()
    assert_every_step_trained_whole(run, 6)
    lost = re.findall(rf"'group_id': '([^']+)'.*?\}} lost its server \(server {re.escape(s1)} failed during a "
                      r"completion .*\); replaying it from the start", run.log("actor-actor0"))  # fmt: skip
    assert lost, (open_reply.group(0), run.logs())
    groups = Counter(seen.values())
    whole = all(groups[g] == GROUP for g in lost)
    assert whole, f"groups {lost} that lost server1, not whole in the stream: {groups}"
    assert run.call("trainer0", policy_version, s0, run.token) == 6


@pytest.mark.slow
def test_an_actor_host_joining_mid_run_contributes(cluster) -> None:
    run = cluster(["redis", "server0", "actor0", "actor1", "trainer0"])
    steps = 8
    config, trainers = start(run, steps=steps, servers=["server0"])
    run.start_actor("actor0", config, 0)
    served_version_at_least(run, "actor0", run.server_url("server0"), 2, timeout=240)
    for pid in namespace_pids(run.net.namespace("actor0")):  # actor0 freezes: from here on, only the new host
        os.kill(pid, signal.SIGSTOP)
    time.sleep(0.5)  # a push already on the wire lands
    counts, _ = run.call("redis", stream_state, run.redis_url("redis"), run.redis_password)
    assert counts["pushed"] < steps * BATCH, f"actor0 alone already pushed the whole run: {counts}"
    run.start_actor("actor1", config, 1)
    assert run.wait(trainers, timeout=400) == [0], run.logs()
    assert_every_step_trained_whole(run, steps)  # > counts["pushed"] items trained: actor1's among them
    assert re.search(r"actor 1 task \d+: pushed batch", run.log("actor-actor1")), run.logs()


def lose_a_trainer_host(run: SimulatedCluster, steps: int, bound: float, *extra: str, at_version: int = 2,
                        power_loss: bool = True) -> tuple[object, list, float]:  # fmt: skip
    """Two trainer hosts (``extra``: more arguments of their command); trainer1 loses power once the server serves
    ``at_version`` (``power_loss=False``: its processes are SIGKILLed, its link stays up, so its kernel closes
    their connections): (config, trainers, seconds until trainer0's torchrun exited)."""
    config = run.write_config(steps=steps, server_hosts=["server0"], redis_host="redis",
                              trainer_hosts=["trainer0", "trainer1"],
                              tables=TABLES + f"[timeouts]\ncollective_s = {bound}\n")  # fmt: skip
    server = run.start_server("server0", config, wait=False)
    run.start_redis("redis")
    trainers = run.start_trainers(["trainer0", "trainer1"], config, "--fresh", *extra)
    run.wait_server("actor0", server)
    run.start_actor("actor0", config, 0)
    served_version_at_least(run, "actor0", server, at_version, timeout=240)
    if power_loss:
        run.net.link_down("trainer1")  # a power loss: its peers get no reset, their packets just vanish
    run.net.kill_host("trainer1")
    died = time.monotonic()
    assert run.wait(trainers[:1], timeout=bound + 90) != [0], run.logs()
    return config, trainers, time.monotonic() - died


@pytest.mark.slow
def test_a_trainer_host_losing_power_stops_the_other_rank_within_the_collective_bound(cluster) -> None:
    run = cluster(["redis", "server0", "actor0", "trainer0", "trainer1"])
    bound = 20.0
    _, _, stopped_after = lose_a_trainer_host(run, steps=8, bound=bound)
    assert bound - 1 <= stopped_after <= bound + 15, run.log("trainer-trainer0")[-4000:]
    log = run.log("trainer-trainer0")
    assert re.search(r"Timed out waiting 20000ms|WaitTimeout", log), log[-4000:]


@pytest.mark.slow
def test_a_trainer_rank_killed_on_a_live_link_stops_the_other_at_once_with_peer_lost_naming_it(cluster) -> None:
    """Before ``PeerLost``, rank 0 died of gloo's unnamed "RuntimeError: [...pair.cc:553] Connection closed by
    peer [10.213.S.N]:P" (or "Read error ...: Connection reset by peer"), naming no collective and no rank."""
    run = cluster(["redis", "server0", "actor0", "trainer0", "trainer1"])
    bound = 300.0  # far above what the test allows: the stop must come from the closed connection, not a timeout
    _, _, stopped_after = lose_a_trainer_host(run, steps=8, bound=bound, power_loss=False)
    log = run.log("trainer-trainer0")
    assert stopped_after <= 30, (stopped_after, log[-4000:])
    named = re.search(r"PeerLost: torch\.distributed (.+?) on rank 0: lost rank 1 at 10\.213\.\d+\.\d+ after", log)
    assert named, log[-4000:]  # the collective, this rank and the one lost, with its host's address
    assert "resume from the last checkpoint" in log, log[-4000:]


@pytest.mark.slow
def test_after_a_trainer_host_is_lost_the_run_resumes_from_its_checkpoint_on_fewer_hosts(cluster) -> None:
    run = cluster(["redis", "server0", "actor0", "trainer0", "trainer1"])
    steps = 8
    # checkpoints every 2 steps, the host lost once step 3 is published: the server is ahead of the checkpoint
    config, _, _ = lose_a_trainer_host(run, steps, 20.0, "--set", "checkpoint.every_n_steps=2", at_version=3)
    state = run.checkpoint_state()
    cursor = state["metadata"]["batch_source"]
    # every item pushed (XADD acknowledged) that the checkpoint does not cover: still in the stream
    uncovered = run.call(
        "redis", stream_ids_after, run.redis_url("redis"), run.redis_password, cursor["last_id"]
    )
    served = run.call("trainer0", policy_version, run.server_url("server0"), run.token)
    assert served > state["step"], (served, state)  # steps published after the checkpoint were lost
    resumed = run.start_trainers(["trainer0"], config, "--set", "cluster.trainer_nodes=1")
    assert run.wait(resumed, timeout=400) == [0], run.logs()
    assert f"resuming at step {state['step']} of {steps}" in run.log("trainer-trainer0")
    final = run.checkpoint_state()
    assert (final["step"], final["world_size"]) == (steps, 1)
    # the server took the checkpoint's weights back at its version, then every step after it
    assert run.call("trainer0", policy_version, run.server_url("server0"), run.token) == steps
    assert_every_step_trained_whole(run, steps)
    done = final["metadata"]["batch_source"]
    assert uncovered and stream_id(done["last_id"]) >= max(map(stream_id, uncovered)), (uncovered, done)
    # read past them (in id order, from the checkpoint's cursor), and every entry read after the resume is
    # accounted for (docs/pipeline_rl.md's delivery guarantee): trained by a step after it, or counted as
    # dropped (stale: the backlog of the downtime) or skipped
    assert done["consumed"] >= cursor["consumed"] + len(uncovered), (cursor, done)
    counted = sum(done["counters"].values()) - sum(cursor["counters"].values())
    trained = (steps - state["step"]) * BATCH
    assert done["consumed"] - cursor["consumed"] == trained + counted, (cursor, done)


def stream_id(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def stream_ids_after(url: str, password: str, last_id: str) -> list[str]:
    """The ids of the run's stream entries after ``last_id`` (called from a host of the network)."""
    import redis

    r = redis.Redis.from_url(url.replace("redis://", f"redis://:{password}@"), socket_timeout=5)
    start = "-" if last_id in ("0", "0-0") else f"({last_id}"
    return [i.decode() for i, _ in r.xrange(f"ludic:pipeline:{RUN_ID}:items", min=start)]
