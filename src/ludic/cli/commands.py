"""Sub-command parsers and handlers; the heavy imports happen only inside the handlers."""

from __future__ import annotations

import argparse
import json
from dataclasses import MISSING, fields
from typing import Any

from ludic.quickstart.config import HELP, QuickstartConfig


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_quickstart_parser(sub: Any) -> None:
    p = sub.add_parser(
        "quickstart",
        help="train a tiny policy with RL on this machine (builds the model, SFT warm start, GRPO)",
        description="Build a ~1M-parameter model, warm it up with SFT, train it with GRPO on a task that "
        "needs the prompt, and leave metrics JSONL, a PNG plot, a checkpoint and a before/after summary.",
    )
    for f in fields(QuickstartConfig):
        default = f.default if f.default is not MISSING else None
        if f.type in ("bool", bool) and default is False:
            p.add_argument(_flag(f.name), dest=f.name, action="store_true", help=HELP[f.name])
            continue
        if f.type in ("bool", bool):
            p.add_argument(
                _flag("no_" + f.name), dest=f.name, action="store_false", help=f"do not {HELP[f.name]}"
            )
            continue
        kind = {"int": int, "float": float}.get(str(f.type), str)
        p.add_argument(
            _flag(f.name),
            dest=f.name,
            type=kind,
            default=default,
            help=f"{HELP[f.name]} (default: {default})",
        )
    p.set_defaults(run=_run_quickstart)


def _run_quickstart(args: argparse.Namespace) -> int:
    from ludic.quickstart.run import run_quickstart

    cfg = QuickstartConfig(**{f.name: getattr(args, f.name) for f in fields(QuickstartConfig)})
    run_quickstart(cfg)
    return 0


def add_train_parser(sub: Any) -> None:
    p = sub.add_parser("train", help="train from a TOML/YAML run config")
    p.add_argument("config", help="path to a .toml/.yaml run config (see examples/configs/)")
    p.add_argument("--steps", type=int, default=None, help="override the config's steps")
    p.add_argument("--dry-run", action="store_true", help="validate the config and print it; start nothing")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start over: remove this run's metrics, checkpoints, eval results and final model (listed "
        "first) instead of resuming from the latest checkpoint",
    )
    _add_import_flag(p)
    _add_override_flags(p)
    p.set_defaults(run=_run_train)


def _add_import_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (a dotted name or a .py path) first, so the envs, harnesses, protocols and "
        "algorithms it registers can be named; repeatable, after the config's own imports",
    )


def _add_override_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="change one config key (e.g. trainer.lr=1e-5, steps=20, rollout.sampling.temperature=0.7); the "
        "value is read as TOML (a bare word is a string); checked as the same key in the file; repeatable",
    )
    p.add_argument(
        "--output-dir",
        default=None,
        metavar="DIR",
        help="override [logging].output_dir (a [checkpoint].output_dir under the old one moves with it)",
    )


def _import_user_modules(names: list[str], base_dir: Any) -> None:
    """The user's modules, imported before any registry lookup; a failure is a ConfigError naming it."""
    from ludic.config import ConfigError
    from ludic.registry.user_modules import UserImportError, import_user_modules

    try:
        import_user_modules(names, base_dir=base_dir)
    except UserImportError as exc:
        raise ConfigError([str(exc)]) from exc


def add_eval_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluate a model on held-out episodes from a run config")
    p.add_argument("config", help="path to a .toml/.yaml run config")
    p.add_argument("--model", default=None, help="override [model].path (e.g. a trained checkpoint)")
    p.add_argument("--dry-run", action="store_true", help="validate the config and print it; start nothing")
    _add_import_flag(p)
    _add_override_flags(p)
    p.set_defaults(run=_run_eval)


def _load(args: argparse.Namespace) -> Any:
    from pathlib import Path

    from ludic.cli.models import prepare_model_sources
    from ludic.cli.preflight import preflight
    from ludic.config import ConfigError, load_config

    # raises ConfigError before anything starts; --set keys are checked as the file's own
    cfg = load_config(args.config, args.overrides, output_dir=args.output_dir)
    _import_user_modules(cfg.imports, Path(args.config).parent)  # config paths: next to the config
    _import_user_modules(args.imports, Path.cwd())  # flag paths: from where ludic runs
    if getattr(args, "steps", None) is not None:
        if args.steps < 0:
            raise ConfigError([f"--steps: must be >= 0, got {args.steps}"])
        cfg.steps = args.steps
    if getattr(args, "model", None):
        cfg.model.path = args.model
    prepare_model_sources(cfg, dry_run=args.dry_run)  # a GGUF file or catalogue name -> a model folder
    preflight(cfg, train=args.command == "train")  # names, kwargs, sizes: still before any model loads
    return cfg


def _print_config(cfg: Any) -> None:
    print(json.dumps(cfg.model_dump(mode="json"), indent=2))


def _run_train(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if args.dry_run:
        _print_config(cfg)
        return 0
    from ludic.cli.run_config import train_from_config
    from ludic.cli.run_loggers import library_progress_bars

    library_progress_bars(cfg)
    train_from_config(cfg, fresh=args.fresh)
    return 0


def _run_eval(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if args.dry_run:
        _print_config(cfg)
        return 0
    from ludic.cli.run_config import eval_from_config
    from ludic.cli.run_loggers import library_progress_bars

    library_progress_bars(cfg)
    stats = eval_from_config(cfg)
    print(json.dumps(stats, indent=2))
    return 0


def add_list_parser(sub: Any) -> None:
    p = sub.add_parser("list", help="list registered envs, harnesses, protocols and algorithms")
    _add_import_flag(p)
    p.set_defaults(run=_run_list)


def _run_list(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ludic.registry import ALGORITHM_REGISTRY, ENV_REGISTRY, HARNESS_REGISTRY, PROTOCOL_REGISTRY

    _import_user_modules(args.imports, Path.cwd())

    for reg in (ENV_REGISTRY, HARNESS_REGISTRY, PROTOCOL_REGISTRY, ALGORITHM_REGISTRY):
        print(f"{reg.plural}: {', '.join(reg.names())}")
    return 0


def add_cluster_parser(sub: Any) -> None:
    p = sub.add_parser("cluster", help="multi-host runs: render the Slurm and Kubernetes recipes from [cluster]")
    actions = p.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    r = actions.add_parser(
        "render",
        help="write a Slurm batch script and/or Kubernetes manifests that start every role of [cluster]",
        description="Render the launch recipes of docs/cluster.md from the config's [cluster] table (and its "
        "[cluster.slurm] / [cluster.kubernetes] settings). No token is written: each role reads it from the "
        "environment variable [cluster] names.",
    )
    r.add_argument("config", help="path to a .toml/.yaml run config with a [cluster] table")
    r.add_argument("--slurm", metavar="OUT.sbatch", default=None, help="write the sbatch script here")
    r.add_argument("--kubernetes", metavar="DIR", default=None, help="write the manifests into this folder")
    r.add_argument(
        "--config-path",
        default=None,
        metavar="PATH",
        help="the config's path as the Slurm nodes see it (default: CONFIG as given, relative to the job's "
        "working directory)",
    )
    r.set_defaults(run=_run_cluster_render)


def _run_cluster_render(args: argparse.Namespace) -> int:
    from ludic.cluster.recipes import render_recipes

    for path in render_recipes(
        args.config, slurm=args.slurm, kubernetes=args.kubernetes, config_path=args.config_path
    ):
        print(f"wrote {path}")
    return 0


def add_actor_parser(sub: Any) -> None:
    p = sub.add_parser(
        "actor",
        help="an actor host of a multi-host run: play [rollout] episodes on [cluster].servers, push to its Redis",
        description="Runs [cluster].actor_tasks rollout tasks against [cluster].servers (episodes spread over "
        "them, each on one server) and pushes whole batches of SAW items to [cluster].redis_url's stream, "
        "until SIGTERM / Ctrl-C (a batch still in generation is dropped). docs/cluster.md.",
    )
    p.add_argument("config", help="path to a .toml/.yaml run config with a [cluster] table")
    p.add_argument("--actor-id", type=int, default=0, help="this host's number (0, 1, ...): its env seeds")
    p.add_argument("--batches", type=int, default=None, help="stop after N batches per task (default: run on)")
    p.add_argument("--grace-s", type=float, default=30.0,
                   help="after SIGTERM, seconds to let the tasks stop before cancelling them (default 30)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="validate the config and print it; start nothing")
    _add_import_flag(p)
    _add_override_flags(p)
    p.set_defaults(run=_run_actor)


def _run_actor(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if args.dry_run:
        _print_config(cfg)
        return 0
    from ludic.cluster.actor_role import run_actor

    return run_actor(cfg, actor_id=args.actor_id, batches=args.batches, grace_s=args.grace_s)


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="an inference-server host of a multi-host run: serve [model] over HTTP (vLLM's routes)",
        description="Serves [model] with Ludic's server; the bearer token comes from the variable "
        "[cluster].api_key_env names (required on a non-loopback address). docs/cluster.md.",
    )
    p.add_argument("config", help="path to a .toml/.yaml run config")
    p.add_argument("--host", required=True, help="the address to bind (0.0.0.0: every interface; needs a token)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch-size", type=int, default=64, help="the largest generation batch (default 64)")
    _add_import_flag(p)
    _add_override_flags(p)
    p.set_defaults(run=_run_serve, dry_run=False)


def _run_serve(args: argparse.Namespace) -> int:
    from ludic.cluster.serve_role import serve, serve_api_key
    from ludic.config import load_config

    # a public bind without a token is refused before any model is prepared or checked
    serve_api_key(load_config(args.config, args.overrides, output_dir=args.output_dir), args.host)
    cfg = _load(args)
    serve(cfg, host=args.host, port=args.port, max_batch_size=args.max_batch_size)
    return 0
