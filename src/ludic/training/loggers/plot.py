"""Plot a run from its metrics JSONL (one ``{"step": n, ...}`` per line) and its held-out evaluations.

Panels that carry no information are left out: the loss panel when the loss never changes (GRPO's
loss is ~0 by construction), the reward panel when there is neither a training reward nor an
evaluation. Held-out evaluations come from the JSONL's ``eval/`` stats and from the run's
``eval/eval_step_<n>_summary.json`` files (the ones before training and after it, which no step logs).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ludic.training.loggers.eval_summary import EVAL_SUMMARY, read_eval_summary
from ludic.training.loggers.prefix import finite_float

_SHOWN = 5
"""How many bad lines a warning lists (a file of another format would otherwise flood the log)."""
_log = logging.getLogger(__name__)


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics JSONL file, in order: JSON objects with an integer ``step``.

    A line that is not one (cut short by a kill, another tool's, hand-edited) is left out of the plot with
    one warning naming the file, its line numbers and what is wrong; the file itself is not changed.
    """
    rows, problems = [], []
    text = Path(path).read_bytes().decode("utf-8", errors="replace")
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        row, problem = _record(line)
        if problem is None:
            rows.append(row)
        else:
            problems.append(f"line {number}: {problem}")
    if problems:
        shown = "; ".join(problems[:_SHOWN]) + ("; ..." if len(problems) > _SHOWN else "")
        _log.warning("%s: %d line(s) left out of the plot: %s", path, len(problems), shown)
    return rows


def _record(line: str) -> tuple[dict, str | None]:
    """``(record, None)``, or ``({}, what is wrong with the line)``."""
    try:
        row = json.loads(line)
    except ValueError as exc:
        return {}, f"not JSON ({exc})"
    if not isinstance(row, dict):
        return {}, f"a JSON {type(row).__name__}, not an object"
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        return {}, f"no integer 'step' (got {step!r:.40})"
    return row, None


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of the rows that have a finite numeric ``key``, by step; a step logged again (a
    resumed run appends the steps after its checkpoint once more) keeps its latest value."""
    points: dict[int, float] = {}
    for row in rows:
        value = finite_float(row.get(key))
        if value is not None:
            points[row["step"]] = value
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def eval_points(
    rows: list[dict], eval_key: str, eval_dir: str | Path | None
) -> tuple[list[int], list[float]]:
    """Held-out evaluations by step: the JSONL's, and the summaries in ``eval_dir`` (which win on a tie).
    A summary that cannot be read (empty, cut short, not an object) is left out with a warning naming it."""
    points = dict(zip(*series(rows, eval_key), strict=True))
    if eval_dir is not None and Path(eval_dir).is_dir():
        for path in Path(eval_dir).iterdir():
            match = EVAL_SUMMARY.fullmatch(path.name)
            if match and path.is_file():
                value = finite_float((read_eval_summary(path, "left out of the plot") or {}).get(eval_key))
                if value is not None:
                    points[int(match.group(1))] = value
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
