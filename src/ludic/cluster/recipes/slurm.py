"""The Slurm recipe: one ``sbatch`` script, a heterogeneous job with one component per role.

Component 0 is Redis, 1 the inference servers, 2 the trainer, 3 the actors, so each role gets its own
node count and resources (GPUs only where they are used). The nodes' names are known only when the job
runs: the script reads each component's node list, starts Redis and the servers, waits (bounded) until each
accepts connections, then starts the actors and, in the foreground, the trainer, pointing both at the
allocated hosts with ``--set cluster.<key>=...``. The job ends with the trainer; the other roles are
stopped then. Values reach the shell only through ``shlex.quote`` or an alphabet checked by the config;
``[cluster.slurm].setup`` is the one line written as shell on purpose.
"""

from __future__ import annotations

import re

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

GROUPS = ("REDIS_HOSTS", "SERVER_HOSTS", "TRAINER_HOSTS", "ACTOR_HOSTS")
"""The shell arrays of each heterogeneous component's nodes, in component order."""

_PLACEHOLDER = re.compile(r"@([A-Z_]+?)(?:__(\d+))?@")


def _host(group: str, i: int = 0) -> str:
    """A placeholder for the i-th node of a component, expanded by ``_expand`` once the line is quoted."""
    return f"@{group}__{i}@"


def _expand(line: str, *, quoted: bool = True) -> str:
    """Placeholders -> shell expansions (``"${SERVER_HOSTS[1]}"``); ``quoted=False`` inside a "..." string."""

    def sub(m: re.Match[str]) -> str:
        ref = f"${{{m.group(1)}[{m.group(2)}]}}" if m.group(2) else f"${{{m.group(1)}}}"
        return f'"{ref}"' if quoted else ref

    return _PLACEHOLDER.sub(sub, line)


def _double_quoted(text: str) -> str:
    """``text`` in a bash "..." string, placeholders expanded inside it and nothing else."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return '"' + _expand(escaped, quoted=False) + '"'


def _sbatch_lines(cluster: ClusterSection) -> list[str]:
    s = cluster.slurm
    sizes = (1, len(cluster.servers), cluster.trainer_nodes, cluster.actor_hosts)
    roles = ("Redis", "inference servers", "trainer", "actors")
    lines = [f"#SBATCH --job-name={s.job_name}", "#SBATCH --output=%x-%j.out"]
    for group, (size, role) in enumerate(zip(sizes, roles)):
        if group:
            lines.append("#SBATCH hetjob")
        lines.append(f"# component {group}: {role}")
        lines += [f"#SBATCH --partition={s.partition}"] if s.partition else []
        lines += [f"#SBATCH --account={s.account}"] if s.account else []
        lines += [f"#SBATCH --time={s.time_limit}", f"#SBATCH --nodes={size}", "#SBATCH --ntasks-per-node=1",
                  f"#SBATCH --cpus-per-task={s.cpus_per_task}"]  # fmt: skip
        if role in ("inference servers", "trainer") and s.gpus_per_node:
            lines.append(f"#SBATCH --gpus-per-node={s.gpus_per_node}")
    return lines


WAIT_FOR = """\
wait_for() {  # HOST PORT WHAT: bounded wait until HOST:PORT accepts a connection
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      echo "ludic: $3 at $1:$2 did not accept connections within ${READY_TIMEOUT_S}s" >&2
      exit 1
    fi
    sleep 1
  done
}"""


def render_slurm(cluster: ClusterSection, config: str) -> str:
    """The sbatch script for ``cluster``; ``config`` is the config's path as the nodes see it.

    (No apostrophe in the ``${VAR:?message}`` lines: bash reads one there as an opening quote.)"""
    s = cluster.slurm
    api, pw = cluster.api_key_env, cluster.redis_password_env
    out = ["#!/bin/bash", "# Rendered by `ludic cluster render` from [cluster] (docs/cluster.md); render again after",
           f"# changing the config. Submit with the tokens in the environment: {api}=... {pw}=... sbatch THIS",
           *_sbatch_lines(cluster), "", "set -euo pipefail",
           f': "${{{api}:?export the bearer token of the servers in {api} before sbatch}}"',
           f': "${{{pw}:?export the Redis password in {pw} before sbatch}}"']  # fmt: skip
    out += ["# [cluster.slurm].setup (unset variables allowed: module and venv scripts read some)",
            "set +u", s.setup, "set -u"] if s.setup else []  # fmt: skip
    out += [f"CONFIG={shell_join([config])}", f"READY_TIMEOUT_S={s.ready_timeout_s}"]
    for group, name in enumerate(GROUPS):
        out.append(f'mapfile -t {name} < <(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_{group}")')
    out += ["trap 'kill $(jobs -p) 2>/dev/null || true' EXIT  # the background roles stop when the job ends",
            WAIT_FOR, "", "# Redis (component 0)"]  # fmt: skip
    script = redis_script(cluster, binary=s.redis_server, data_dir=s.redis_dir)
    # a quoted here-document keeps the script literal; no value in it can be a whole line (the config
    # refuses newlines), so none can end it early
    out += [
        "REDIS_SCRIPT=$(cat <<'LUDIC_REDIS_SCRIPT_END'",
        script.rstrip("\n"),
        "LUDIC_REDIS_SCRIPT_END",
        ")",
    ]
    out.append('srun --het-group=0 --nodes=1 --ntasks=1 bash -c "$REDIS_SCRIPT" &')
    out.append(_expand(f"wait_for {_host('REDIS_HOSTS')} {redis_endpoint(cluster).port} Redis"))
    out.append("# inference servers (component 1), one step per server")
    for i, e in enumerate(server_endpoints(cluster)):
        step = ["srun", "--het-group=1", "--nodes=1", "--ntasks=1", f"--nodelist={_host('SERVER_HOSTS', i)}"]
        out.append(_expand(shell_join([*step, *server_argv("@CONFIG@", e.port)])) + " &")
    for i, e in enumerate(server_endpoints(cluster)):
        out.append(_expand(f"wait_for {_host('SERVER_HOSTS', i)} {e.port} {shell_join([f'server {i}'])}"))
    overrides = address_overrides(cluster, redis_host=_host("REDIS_HOSTS"), master_host=_host("TRAINER_HOSTS"),
                                  server_hosts=[_host("SERVER_HOSTS", i) for i in range(len(cluster.servers))])  # fmt: skip
    out.append("ADDRESSES=(" + " ".join(_double_quoted(a) for a in overrides) + ")")
    out.append("# actors (component 3), one per node, each on its own stretch of env seeds")
    for i in range(cluster.actor_hosts):
        step = ["srun", "--het-group=3", "--nodes=1", "--ntasks=1", f"--nodelist={_host('ACTOR_HOSTS', i)}"]
        out.append(_expand(shell_join([*step, *actor_argv("@CONFIG@", str(i))])) + ' "${ADDRESSES[@]}" &')
    out.append("# the trainer (component 2): one torchrun per node, in the foreground; the job ends with it")
    step = ["srun", "--het-group=2", f"--nodes={cluster.trainer_nodes}", "--ntasks-per-node=1"]
    argv = trainer_argv(cluster, "@CONFIG@", rdzv_host=_host("TRAINER_HOSTS"), rdzv_id="@SLURM_JOB_ID@")
    out.append(_expand(shell_join([*step, *argv])) + ' "${ADDRESSES[@]}"')
    return "\n".join(out) + "\n"
