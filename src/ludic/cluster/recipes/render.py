"""``ludic cluster render CONFIG --slurm OUT --kubernetes DIR``: the launch recipes written from a config."""

from __future__ import annotations

from pathlib import Path

from ludic.cluster.recipes.kubernetes import render_kubernetes
from ludic.cluster.recipes.roles import RecipeError
from ludic.cluster.recipes.slurm import render_slurm
from ludic.config import ConfigError, load_config
from ludic.config.cluster_section import ClusterSection


def load_cluster(config: str | Path) -> ClusterSection:
    """The config's ``[cluster]`` table, the whole config validated first."""
    cfg = load_config(config)
    if cfg.cluster is None:
        raise ConfigError(
            [f"{config}: no [cluster] table: the recipes place the roles it names (docs/cluster.md)"]
        )
    return cfg.cluster


def render_recipes(
    config: str | Path, *, slurm: str | Path | None = None, kubernetes: str | Path | None = None,
    config_path: str | None = None,
) -> list[Path]:  # fmt: skip
    """Write the Slurm script to ``slurm`` and the manifests into the folder ``kubernetes``; the paths written.

    ``config_path``: the config's path as the Slurm nodes see it (default: ``config`` as given); the
    Kubernetes pods get the file's text in a ConfigMap instead."""
    if slurm is None and kubernetes is None:
        raise ConfigError(
            ["ludic cluster render: name at least one of --slurm OUT.sbatch and --kubernetes DIR"]
        )
    cluster = load_cluster(config)
    try:
        script = render_slurm(cluster, config_path or str(config)) if slurm is not None else None
        text = Path(config).read_text(encoding="utf-8")
        manifests = render_kubernetes(cluster, Path(config).name, text) if kubernetes is not None else {}
    except RecipeError as exc:
        raise ConfigError([str(exc)]) from exc
    written = []
    if script is not None:
        Path(slurm).parent.mkdir(parents=True, exist_ok=True)
        Path(slurm).write_text(script, encoding="utf-8")
        written.append(Path(slurm))
    if kubernetes is not None:
        Path(kubernetes).mkdir(parents=True, exist_ok=True)
        for name, body in manifests.items():
            (Path(kubernetes) / name).write_text(body, encoding="utf-8")
            written.append(Path(kubernetes) / name)
    return written
