"""The one-screen before/after summary printed when the quickstart ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from ludic.quickstart.config import QuickstartConfig

if TYPE_CHECKING:
    from ludic.quickstart.run import QuickstartResult


def summary_table(cfg: QuickstartConfig, result: QuickstartResult) -> Table:
    table = Table(title="held-out evaluation: mean reward (0..1), sampled at temperature 1")
    table.add_column("policy")
    table.add_column("reward", justify="right")
    chance = 1.0 / len(cfg.letters)
    table.add_row("prompt-ignoring policy (chance)", f"{chance:.3f}")
    if cfg.sft_steps:
        table.add_row("initial model", f"{result.eval_initial:.3f}")
        table.add_row(
            f"after SFT warm start ({cfg.sft_steps} steps) = start of RL", f"{result.eval_before_rl:.3f}"
        )
    else:
        table.add_row("start of RL", f"{result.eval_before_rl:.3f}")
    table.add_row(f"after {cfg.algorithm} ({cfg.steps} steps)", f"[bold]{result.eval_after:.3f}[/bold]")
    table.add_row("gain from RL", f"[bold]{result.rl_gain:+.3f}[/bold]")
    return table


def print_summary(cfg: QuickstartConfig, result: QuickstartResult, console: Console | None = None) -> None:
    console = console or Console()
    lines = [
        f"wall time (SFT + RL + evals): {result.train_seconds:.1f} s; RL {result.rl_seconds_per_step:.3f} s/step",
        *(f"{name:>10}: {path}" for name, path in result.paths.items()),
    ]
    console.print(summary_table(cfg, result))
    console.print(Panel("\n".join(lines), title="Ludic quickstart: done", expand=False))
