"""Plumbing the tutorial scripts share: a tiny policy + engine pair, SFT warm start, GRPO, plot.

Everything here is public Ludic API; it is kept apart only so each tutorial script shows its env,
its agent and its training in one screen. See docs/tutorial.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ludic.distributed import ClientPublisher
from ludic.eval import Evaluator
from ludic.inference import TransformersChatClient
from ludic.training import (
    RolloutEngine,
    RolloutRequest,
    SAWItem,
    SeededRequests,
    TrainerConfig,
    make_grpo,
    online_trainer,
    sft_trainer,
)
from ludic.training.loggers import ProgressLogger, before_after, progress_and_metrics

HELD_OUT_SEEDS = 10**6
"""Held-out episodes use env seeds from here up; training seeds stay below."""


def flags(
    doc: str, *, steps: int, output_dir: str | None, sft_steps: int | None = 40
) -> argparse.ArgumentParser:
    """The flags every tutorial run takes: ``--steps``, ``--sft-steps`` (when it warms up), ``--seed``,
    ``--output-dir``; a script adds its own to the parser before ``parse_args()``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=steps, help="GRPO steps")
    if sft_steps is not None:
        p.add_argument("--sft-steps", type=int, default=sft_steps, help="SFT warm-start steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", type=Path, default=output_dir and Path(output_dir))
    return p


def tiny_policy(out: Path, seed: int) -> tuple[Any, Any, TransformersChatClient]:
    """(trainer's model, tokenizer, embedded inference engine) for a freshly built ~0.8M-param model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ludic.testing import build_tiny_model

    torch.manual_seed(seed)
    path = build_tiny_model(out / "initial_model", seed=seed)
    model = AutoModelForCausalLM.from_pretrained(path)
    return model, AutoTokenizer.from_pretrained(path), TransformersChatClient(path, model_name="policy")


def held_out_evaluator(
    engine: RolloutEngine, episode: Callable[[int], RolloutRequest], n: int, *, max_turns: int = 1,
    concurrency: int = 64,
) -> Evaluator:  # fmt: skip
    """``n`` fixed held-out episodes (seeds from ``HELD_OUT_SEEDS``, never trained on)."""
    requests = [episode(HELD_OUT_SEEDS + i) for i in range(n)]
    return Evaluator(engine=engine, requests=requests, max_steps=max_turns, concurrency=concurrency)


async def warm_start(
    model: Any, client: Any, items: list[SAWItem], *, steps: int, lr: float, seed: int
) -> None:
    """SFT on demonstrations (``sft_data``), then push the weights to the engine."""
    cfg = TrainerConfig(lr=lr, max_seq_len=256, micro_token_budget=8192)
    trainer = sft_trainer(model, items, batch_size=16, seed=seed, publisher=ClientPublisher(client), cfg=cfg)
    await trainer.train(steps)
    client.restart_versions(0)  # the RL trainer publishes version = its step, counting from 1 again


async def grpo(
    model: Any,
    client: Any,
    engine: RolloutEngine,
    episode: Callable[[int], RolloutRequest],
    *,
    steps: int,
    seed: int,
    prompts_per_step: int = 4,
    group_size: int = 8,
    lr: float = 5e-4,
    max_turns: int = 1,
    log_path: Path | None = None,
    prefix: str = "[tutorial]",
    publisher: Any = None,
) -> list[dict[str, float]]:
    """GRPO with warm-up + linear decay; returns the per-step stats (``Trainer.train``'s history).

    Each step plays ``prompts_per_step`` new episodes (env seeds from ``seed * 10**5`` up), each by a
    group of ``group_size``. ``publisher`` defaults to ``ClientPublisher(client)`` (full weights).
    Prints one short line per step (``prefix step 3/150  reward 0.250  loss -0.012  0.4 s``); every
    stat goes to ``log_path`` (a metrics JSONL) when given.
    """
    requests = SeededRequests(episode, per_step=prompts_per_step, next_seed=seed * 10**5, stop=HELD_OUT_SEEDS)
    cfg = TrainerConfig(
        lr=lr,
        lr_schedule="linear",
        warmup_steps=min(10, steps),
        total_steps=steps,
        max_seq_len=512,
        micro_token_budget=8192,
    )
    logger = (
        progress_and_metrics(log_path, prefix, total_steps=steps)
        if log_path is not None
        else ProgressLogger(prefix, total_steps=steps)
    )
    trainer = online_trainer(
        model,
        engine=engine,
        algo=make_grpo(group_size=group_size),  # the batch source forms groups of this size
        request_fn=requests,
        max_steps=max_turns,
        publisher=publisher or ClientPublisher(client),
        cfg=cfg,
        train_logger=logger,
    )
    return await trainer.train(steps)


async def held_out_reward(evaluator: Evaluator) -> float:
    return (await evaluator.evaluate())["eval/avg_total_reward"]


def mean_interval(values: list[float], z: float = 1.96) -> dict[str, float]:
    """Mean, 95% normal interval (``mean +- z * sd / sqrt(n)``) and n of per-episode values."""
    n = len(values)
    mean = sum(values) / max(n, 1)
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 if n > 1 else 0.0
    half = z * sd / max(n, 1) ** 0.5
    return {"mean": mean, "ci95_low": mean - half, "ci95_high": mean + half, "n": n}


async def held_out(evaluator: Evaluator) -> dict[str, float]:
    """``mean_interval`` of the total reward over the evaluator's episodes that played (a seat that never
    moved, ``meta["empty"]``, is left out, as in ``eval/avg_total_reward``)."""
    await evaluator.evaluate()
    return mean_interval([r.total_reward for r in evaluator.last_rollouts if not r.meta.get("empty")])


def print_report(report: dict[str, Any], prefix: str, out: Path) -> None:
    """The before/after lines a run ends with; the whole report goes to the run folder's ``summary.json``."""
    import json

    def mean(value: Any) -> float:
        return value["mean"] if isinstance(value, dict) else value

    if "initial" in report:
        print(before_after("held-out reward, initial -> start of RL:", mean(report["initial"]),
                           mean(report["start_of_rl"]), prefix=prefix))  # fmt: skip
    print(before_after("held-out reward, start of RL -> end:", mean(report["start_of_rl"]),
                       mean(report["end"]), prefix=prefix))  # fmt: skip
    (out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"{prefix} every stat per step: {out / 'metrics.jsonl'}; report: {out / 'summary.json'}")


def plot(history: list[dict[str, float]], path: Path, title: str) -> Path:
    """Training reward per step (and its 10-step mean) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rewards = [h.get("train/avg_total_reward", float("nan")) for h in history]
    smooth = [
        sum(rewards[max(0, i - 9) : i + 1]) / len(rewards[max(0, i - 9) : i + 1]) for i in range(len(rewards))
    ]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(rewards) + 1), rewards, alpha=0.35, label="train reward")
    ax.plot(range(1, len(rewards) + 1), smooth, label="10-step mean")
    ax.set(xlabel="GRPO step", ylabel="reward", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
