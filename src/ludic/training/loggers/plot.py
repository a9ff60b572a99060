"""Plot reward and loss against step from a metrics JSONL (one ``{"step": n, ...}`` per line)."""

from __future__ import annotations

import json
import math
from pathlib import Path


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


def plot_metrics(
    jsonl_path: str | Path,
    png_path: str | Path,
    *,
    reward_key: str = "train/avg_total_reward",
    loss_key: str = "train/loss",
    eval_key: str = "eval/avg_total_reward",
    title: str = "Ludic training",
) -> Path:
    """Write a two-panel PNG (reward on top, loss below) and return its path."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed; safe in tests and over ssh
    import matplotlib.pyplot as plt

    rows = read_metrics(jsonl_path)
    fig, (ax_reward, ax_loss) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    steps, rewards = series(rows, reward_key)
    ax_reward.plot(steps, rewards, color="tab:blue", alpha=0.5, label="train reward")
    if len(rewards) >= 5:
        window = max(len(rewards) // 10, 3)
        smooth = [
            sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
            for i in range(len(rewards))
        ]
        ax_reward.plot(steps, smooth, color="tab:blue", label=f"train reward ({window}-step mean)")
    eval_steps, evals = series(rows, eval_key)
    if evals:
        ax_reward.plot(eval_steps, evals, "o-", color="tab:green", label="held-out eval reward")
    ax_reward.set_ylabel("reward")
    ax_reward.set_ylim(-0.02, 1.02)
    ax_reward.legend(loc="lower right", fontsize=8)
    ax_reward.set_title(title)
    loss_steps, losses = series(rows, loss_key)
    ax_loss.plot(loss_steps, losses, color="tab:red")
    ax_loss.set_ylabel("loss")
    ax_loss.set_xlabel("step")
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
