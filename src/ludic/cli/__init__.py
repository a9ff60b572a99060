"""The ``ludic`` command line: ``quickstart``, ``train CONFIG``, ``eval CONFIG``, ``list``, ``export RUN OUT``, ``models``,
``cluster render CONFIG``, ``actor CONFIG``, ``serve CONFIG``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ludic.cli.commands import (
    add_actor_parser,
    add_cluster_parser,
    add_eval_parser,
    add_list_parser,
    add_quickstart_parser,
    add_serve_parser,
    add_train_parser,
)
from ludic.cli.export import ExportError, add_export_parser
from ludic.cli.models import add_models_parser
from ludic.config import ConfigError
from ludic.models.errors import ModelPrepError
from ludic.training.checkpoint.manager import CheckpointLoadError
from ludic.training.checkpoint.resume import ResumeError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ludic", description="Train LLM agents with reinforcement learning."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_quickstart_parser(sub)
    add_train_parser(sub)
    add_eval_parser(sub)
    add_list_parser(sub)
    add_export_parser(sub)
    add_models_parser(sub)
    add_cluster_parser(sub)
    add_actor_parser(sub)
    add_serve_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ludic`` script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ConfigError, ResumeError, CheckpointLoadError, ModelPrepError, ExportError) as exc:
        print(f"ludic {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C (or user code raising it): one line and the shell's code, no traceback
        print(f"ludic {args.command}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # user code (an env factory, a reward) called sys.exit: never a silent success
        code = exc.code if isinstance(exc.code, int) and exc.code != 0 else 1
        print(f"ludic {args.command}: stopped by sys.exit({exc.code!r}) from code the run called", file=sys.stderr)
        return code


__all__ = ["build_parser", "main"]
