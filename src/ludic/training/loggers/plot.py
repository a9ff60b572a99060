"""Plot a run from its metrics JSONL (one ``{"step": n, ...}`` per line) and its held-out evaluations.

Panels that carry no information are left out: the loss panel when the loss never changes (GRPO's
loss is ~0 by construction), the reward panel when there is neither a training reward nor an
evaluation. Held-out evaluations come from the JSONL's ``eval/`` stats and from the run's
``eval/eval_step_<n>_summary.json`` files (the ones before training and after it, which no step logs).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

EVAL_SUMMARY = re.compile(r"eval_step_(-?\d+)_summary\.json")


def read_metrics(path: str | Path) -> list[dict]:
    """The JSON objects of a metrics JSONL file, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of the rows that have a finite numeric ``key``."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(int(row["step"]))
            values.append(float(value))
    return steps, values


def eval_points(
    rows: list[dict], eval_key: str, eval_dir: str | Path | None
) -> tuple[list[int], list[float]]:
    """Held-out evaluations by step: the JSONL's, and the summaries in ``eval_dir`` (which win on a tie)."""
    points = dict(zip(*series(rows, eval_key), strict=True))
    if eval_dir is not None and Path(eval_dir).is_dir():
        for path in Path(eval_dir).iterdir():
            match = EVAL_SUMMARY.fullmatch(path.name)
            if match:
                value = json.loads(path.read_text()).get(eval_key)
                if isinstance(value, (int, float)) and math.isfinite(value):
                    points[int(match.group(1))] = float(value)
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def informative(values: list[float]) -> bool:
    """A series worth a panel: present and not one constant value."""
    return bool(values) and max(values) - min(values) > 1e-12


def plot_panels(rewards: list[float], evals: list[float], losses: list[float]) -> list[str]:
    """The panels worth drawing, top to bottom: "reward" (training reward or evaluations), "loss" (when it
    changes); one empty "reward" panel when nothing is."""
    panels = [name for name, show in (("reward", rewards or evals), ("loss", informative(losses))) if show]
    return panels or ["reward"]


def plot_metrics(
    jsonl_path: str | Path,
    png_path: str | Path,
    *,
    reward_key: str = "train/avg_total_reward",
    loss_key: str = "train/loss",
    eval_key: str = "eval/avg_total_reward",
    title: str = "Ludic training",
    eval_dir: str | Path | None = None,
) -> Path:
    """Write the PNG (reward and held-out evaluations on top, loss below: each only when informative) and
    return its path; ``eval_dir``: the run's eval folder, whose summaries add the evaluations no step logged."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed; safe in tests and over ssh
    import matplotlib.pyplot as plt

    rows = read_metrics(jsonl_path)
    steps, rewards = series(rows, reward_key)
    eval_steps, evals = eval_points(rows, eval_key, eval_dir)
    loss_steps, losses = series(rows, loss_key)
    panels = plot_panels(rewards, evals, losses)
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(7, 2.75 * len(panels) + 0.5), sharex=True, squeeze=False
    )
    by_name = dict(zip(panels, axes[:, 0], strict=True))
    if "reward" in by_name:
        _reward_panel(by_name["reward"], steps, rewards, eval_steps, evals)
    if "loss" in by_name:
        by_name["loss"].plot(loss_steps, losses, color="tab:red")
        by_name["loss"].set_ylabel("loss")
    axes[0, 0].set_title(title)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path


def _reward_panel(
    ax: Any, steps: list[int], rewards: list[float], eval_steps: list[int], evals: list[float]
) -> None:
    ax.plot(steps, rewards, color="tab:blue", alpha=0.5, label="train reward")
    if len(rewards) >= 5:
        window = max(len(rewards) // 10, 3)
        smooth = [
            sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
            for i in range(len(rewards))
        ]
        ax.plot(steps, smooth, color="tab:blue", label=f"train reward ({window}-step mean)")
    if evals:
        ax.plot(eval_steps, evals, "o-", color="tab:green", label="held-out eval reward")
    ax.set_ylabel("reward")
    if all(0.0 <= v <= 1.0 for v in rewards + evals):  # a success rate: the whole 0..1 range
        ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="lower right", fontsize=8)
