"""The quickstart as a run config: its flags (``QuickstartConfig``) become the plain data of a
``ludic train`` config, which ``ludic.cli.run_config`` builds and runs exactly as it does a file.

The quickstart writes that data to ``<output_dir>/run_config.yaml``: ``ludic train`` on it replays
the RL phase (from the warm-started model the quickstart saved).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from ludic.config import RunConfig, parse_config
from ludic.quickstart.config import QuickstartConfig

CONFIG_SOURCE = "ludic quickstart"
"""What errors in the quickstart's run config name as their file."""
EVAL_SEED_OFFSET = 1_000_000
"""Held-out env seeds start here; training and SFT seeds stay far below."""
TRAIN_SEEDS_PER_RUN_SEED = 100_000
"""Training env seeds of run seed s start at s * 100_000."""


def prepare_model_dir(cfg: QuickstartConfig) -> Path:
    """The model to start from: ``--model-dir`` as given, else a freshly built tiny model."""
    if cfg.model_dir is not None:
        path = Path(cfg.model_dir)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"--model-dir {path} has no config.json; pass a save_pretrained directory"
            )
        return path
    from ludic.testing import build_tiny_model

    return build_tiny_model(Path(cfg.output_dir) / "initial_model", seed=cfg.seed)


def run_config_data(cfg: QuickstartConfig, model_dir: Path) -> dict[str, Any]:
    """The quickstart's flags as ``ludic train`` config data (the tables of a TOML/YAML file)."""
    sampling = {"temperature": 1.0, "max_tokens": cfg.max_new_tokens}
    return {
        "model": {"path": str(model_dir), "device": cfg.device},
        "env": {"name": "letter_repeat", "kwargs": {"count": cfg.count, "letters": cfg.letters}},
        # a reply cut at max_tokens scores 0: the task's reward stays in [0, 1]
        "harness": {"name": "plain", "kwargs": {"incomplete_reward": 0.0}},
        "algorithm": {"name": cfg.algorithm},
        "rollout": {
            "prompts_per_step": cfg.prompts_per_step,
            "group_size": cfg.group_size,
            "concurrency": cfg.group_size * cfg.prompts_per_step,
            "seed": cfg.seed * TRAIN_SEEDS_PER_RUN_SEED,
            "sampling": sampling,
        },
        # held-out seeds sampled at temperature 1 with fixed sampling seeds: the policy's expected reward
        "eval": {
            "num_episodes": cfg.eval_episodes,
            "seed_offset": EVAL_SEED_OFFSET,
            "concurrency": cfg.eval_episodes,
            "every_n_steps": cfg.eval_every,
            "sampling": sampling,
        },
        "pipeline": _pipeline_table(cfg),
        "trainer": {
            "lr": cfg.lr,
            "max_seq_len": 256,
            "micro_token_budget": 256 * 64,
            "max_grad_norm": 1.0,
            "sync_every_steps": 1,
            "eval_concurrency": cfg.eval_episodes,
            # pipeline: the step computes on a worker thread, so the actor task keeps generating meanwhile
            "step_in_thread": cfg.pipeline,
            # linear warm-up, then linear decay to 0 at the last step (why: ludic.training.schedule)
            "lr_schedule": "linear",
            "warmup_steps": min(cfg.warmup_steps, cfg.steps),
            "total_steps": cfg.steps,
        },
        # output_dir: <logging.output_dir>/checkpoints, so moving the run moves its checkpoints
        "checkpoint": {"max_to_keep": 1, "save_optimizer": False},
        "logging": {"output_dir": cfg.output_dir, "rich": cfg.live, "plot": True},
        "steps": cfg.steps,
        "seed": cfg.seed,
    }


def _pipeline_table(cfg: QuickstartConfig) -> dict[str, Any]:
    """One actor task on the embedded engine; a private Redis under the output folder unless ``redis_url``."""
    if not cfg.pipeline:
        return {"enabled": False}
    table: dict[str, Any] = {"enabled": True, "actors": 1, "max_staleness": cfg.max_staleness}
    if cfg.redis_url:  # a shared Redis keeps earlier runs' streams: this run gets its own
        table.update(redis_url=cfg.redis_url, run_id=f"quickstart-{uuid.uuid4().hex[:12]}")
    else:
        table["run_id"] = "quickstart"
    return table


def refuse_model_dir_in_outputs(model_dir: Path, cfg: RunConfig) -> None:
    """The quickstart starts over, removing its earlier outputs: ``--model-dir`` must not be one of them."""
    from ludic.cli.run_config import output_paths

    model = model_dir.resolve()
    for out in output_paths(cfg):
        if model == out.resolve() or out.resolve() in model.parents:
            raise ValueError(
                f"--model-dir {model_dir} lies inside {out}, which this run replaces; copy the model "
                "elsewhere or pick another --output-dir"
            )


def to_run_config(data: dict[str, Any]) -> RunConfig:
    """Validate :func:`run_config_data`'s output as ``ludic train`` validates a file."""
    return parse_config(data, file=CONFIG_SOURCE)


def write_run_config(data: dict[str, Any], path: Path) -> Path:
    """``data`` as a YAML run config, with a header saying how to replay it."""
    import yaml

    header = (
        "# The RL phase of this `ludic quickstart` run as a `ludic train` config: `ludic train <this file>`\n"
        "# builds it through the same code. [model].path is the model RL started from (after the SFT\n"
        "# warm start, if any). Point [logging].output_dir at a new folder to replay it (its checkpoint\n"
        "# here holds no optimizer state, so `ludic train` cannot resume from it).\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path
