"""The speed curve against TRL: model size x reply length, Ludic and TRL side by side per cell.

Cells: models of about 0.8M, 6M and 25M parameters (tiny Qwen2s built locally, random init) x
replies capped at 4, 32 and 128 tokens, on the quickstart letter task (69-token prompt, group 8 x 4
prompts, lr 1e-3, no KL). Untrained models rarely stop early, so replies run to the cap on both
sides: the cells measure speed at a known reply length, with both trainers doing the same work (the
learning comparison at equal reward is ``bench_vs_trl.py``). Each cell runs Ludic, then TRL, then
Ludic and TRL again (interleaved rounds), each round a warm-up step plus ``--steps`` timed steps,
and reports medians over the timed steps: s/step, generated tokens/s, and where Ludic's step goes
(generation, training, weight push) and where TRL's goes (generation and scoring, training), with the
mean training reward of each side. With ``--floor``, each cell also gets Ludic's matmul floor measured
right after it (``bench_step_floor.py``: the step's matrix products alone, at this core's speed), and
TRL / floor: the lead Ludic would have if everything else in its step cost nothing.

    cd bench && OMP_NUM_THREADS=1 ../.venv/bin/python bench_vs_trl_curve.py [--sizes 0.8M 6M 25M --replies 4 32 128 --floor]

Needs the bench extra (trl, datasets).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench_step_floor import SIZES, cell_floor
from bench_vs_trl import trl_grpo_args, trl_reward_fn

from ludic.envs.letter_repeat import letter_for_seed, prompt_for
from ludic.quickstart.config import QuickstartConfig
from ludic.quickstart.run_config import run_config_data, to_run_config
from ludic.testing import build_tiny_model

KNOBS = {"group_size": 8, "prompts_per_step": 4, "lr": 1e-3, "warmup_steps": 0}


class TimedSource:
    """Wraps a batch source: how long each batch took to generate and how many tokens it sampled."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds: list[float] = []
        self.tokens: list[int] = []
        self.prompt_tokens: list[float] = []  # per row: the prompt's positions (not the sampled ones)
        self.rewards: list[float] = []

    async def next_batch(self) -> Any:
        t0 = time.perf_counter()
        batch = await self.inner.next_batch()
        self.seconds.append(time.perf_counter() - t0)
        self.tokens.append(sum(sum(it.action_mask) for it in batch.items))
        positions = sum(len(it.input_ids) for it in batch.items)
        self.prompt_tokens.append((positions - self.tokens[-1]) / len(batch.items))
        self.rewards.append(float(batch.meta.get("avg_total_reward", float("nan"))))
        return batch


def ludic_trainer(cfg: QuickstartConfig, model_dir: Path) -> tuple[Any, TimedSource, Any]:
    """The Trainer of a curve cell (the quickstart's policy, engine and batches), its timed batch source
    and its inference client."""
    import torch

    from ludic.cli.runtime import load_policy, make_algorithm, make_client, make_engine, make_rollout_source
    from ludic.distributed import ClientPublisher
    from ludic.training._setup import make_adamw
    from ludic.training.config import TrainerConfig
    from ludic.training.trainer import Trainer

    run_cfg = to_run_config(run_config_data(cfg, model_dir))
    torch.manual_seed(run_cfg.seed)
    model, client = load_policy(run_cfg), make_client(run_cfg)
    algo = make_algorithm(run_cfg)
    engine = make_engine(run_cfg, client, run_cfg.rollout.sampling.to_sampling())
    source = TimedSource(make_rollout_source(run_cfg, engine, algo))
    tcfg = TrainerConfig(
        max_seq_len=256, micro_token_budget=256 * 64, max_grad_norm=1.0, sync_every_steps=1,
        pad_token_id=int(client.tokenizer.pad_token_id),
    )  # fmt: skip
    trainer = Trainer(
        model=model, algo=algo, batch_source=source, publisher=ClientPublisher(client), cfg=tcfg,
        optimizer=make_adamw(model.parameters(), lr=cfg.lr, weight_decay=0.0),
    )  # fmt: skip
    return trainer, source, client


async def ludic_round(cfg: QuickstartConfig, model_dir: Path, steps: int) -> list[dict[str, float]]:
    trainer, source, client = ludic_trainer(cfg, model_dir)
    rows = []
    for _ in range(steps + 1):
        stats = await trainer.train_step()
        gen, push = source.seconds[-1], stats.get("perf/publish_seconds", 0.0)
        total = stats["perf/step_seconds"]
        rows.append({
            "step": total, "generation": gen, "push": push, "training": total - gen - push,
            "tokens": source.tokens[-1], "prompt_tokens": source.prompt_tokens[-1], "reward": source.rewards[-1],
        })  # fmt: skip
    client.close() if hasattr(client, "close") else None
    return rows[1:]  # the first step warms up


def trl_round(cfg: QuickstartConfig, model_dir: Path, steps: int, out: Path) -> list[dict[str, float]]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    n = (steps + 1) * cfg.prompts_per_step
    letters = [letter_for_seed(s, cfg.letters) for s in range(cfg.seed * 100_000, cfg.seed * 100_000 + n)]
    data = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": prompt_for(x, cfg.count)}] for x in letters],
            "letter": letters,
        }
    )
    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(time.perf_counter() - self.t0)

    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=trl_reward_fn(cfg.max_new_tokens, int(tokenizer.eos_token_id), cfg.count),
        args=trl_grpo_args(cfg, out, steps=steps + 1, warmup_steps=0),
        train_dataset=data, processing_class=tokenizer, callbacks=[StepTimer()],
    )  # fmt: skip
    generation = time_generation(trainer)
    trainer.train()
    logs = [row for row in trainer.state.log_history if "reward" in row]
    batch = cfg.group_size * cfg.prompts_per_step
    rows = [
        {
            "step": t, "generation": g, "training": t - g,
            "tokens": float(log.get("completions/mean_length", 0.0)) * batch, "reward": float(log["reward"]),
        }
        for t, g, log in zip(times, generation, logs, strict=False)
    ]  # fmt: skip
    return rows[1:]


def time_generation(trainer: Any) -> list[float]:
    """Seconds of each call of TRL's ``_generate_and_score_completions`` (one per step here: one
    generation batch per optimizer step), its sampling and scoring; the rest of TRL's step is training."""
    seconds: list[float] = []
    inner = trainer._generate_and_score_completions

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = inner(*args, **kwargs)
        seconds.append(time.perf_counter() - t0)
        return out

    trainer._generate_and_score_completions = timed
    return seconds


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def cell_setup(size: str, reply: int, steps: int, out: Path) -> tuple[QuickstartConfig, Path]:
    """A cell's config (the quickstart task, ``reply`` new tokens, ``steps`` + 1 steps) and its model."""
    model_dir = build_tiny_model(out / "model", seed=0, **SIZES[size])
    cfg = QuickstartConfig(
        steps=steps + 1, seed=0, output_dir=str(out), live=False, eval_every=0, max_new_tokens=reply, **KNOBS
    )
    return cfg, model_dir


def run_cell(
    size: str, reply: int, steps: int, rounds: int, out: Path, floor: bool = False
) -> dict[str, Any]:
    cfg, model_dir = cell_setup(size, reply, steps, out)
    ludic: list[dict[str, float]] = []
    trl: list[dict[str, float]] = []
    for r in range(rounds):
        ludic += asyncio.run(ludic_round(cfg, model_dir, steps))
        trl += trl_round(cfg, model_dir, steps, out / f"trl{r}")
    cell = {"size": size, "reply_tokens": reply}
    for side, rows in (("ludic", ludic), ("trl", trl)):
        cell[side] = {
            "s_per_step": median(rows, "step"),
            "tokens_per_s": median([{"v": r["tokens"] / r["step"]} for r in rows], "v"),
            "reward": statistics.fmean(r["reward"] for r in rows),
        }
    cell["ludic"].update(
        {k: median(ludic, k) for k in ("generation", "training", "push", "tokens", "prompt_tokens")}
    )
    cell["trl"].update({k: median(trl, k) for k in ("generation", "training")})
    cell["lead"] = cell["trl"]["s_per_step"] / cell["ludic"]["s_per_step"]
    if floor:  # measured right after the cell, so both see the machine in the same state
        cell["floor"] = cell_floor(
            size, reply, repeats=3, tokens=cell["ludic"]["tokens"], prompt_len=cell["ludic"]["prompt_tokens"]
        )
    return cell


def table(cells: list[dict[str, Any]]) -> str:
    floors = all("floor" in c for c in cells)
    lines = [
        "| model | reply tokens | Ludic s/step (gen / train / push) | TRL s/step (gen / train) | Ludic tok/s | "
        "TRL tok/s | lead |" + (" Ludic's matmul floor s (gen / train) | TRL / floor |" if floors else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if floors else ""),
    ]
    for c in cells:
        lu, tr = c["ludic"], c["trl"]
        line = (
            f"| {c['size']} | {c['reply_tokens']} | {lu['s_per_step']:.3f} ({lu['generation']:.3f} / "
            f"{lu['training']:.3f} / {lu['push']:.3f}) | {tr['s_per_step']:.3f} ({tr['generation']:.3f} / "
            f"{tr['training']:.3f}) | {lu['tokens_per_s']:.0f} | {tr['tokens_per_s']:.0f} | {c['lead']:.2f}x |"
        )
        if floors:
            f = c["floor"]
            line += (
                f" {f['floor']:.3f} ({f['generation']:.3f} / {f['training']:.3f}) | "
                f"{tr['s_per_step'] / f['floor']:.2f}x |"
            )
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--replies", nargs="+", type=int, default=[4, 32, 128])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side per round")
    parser.add_argument("--rounds", type=int, default=1, help="Ludic-then-TRL rounds per cell")
    parser.add_argument("--floor", action="store_true", help="also measure each cell's matmul floor")
    parser.add_argument("--out", default="runs/bench_vs_trl_curve")
    args = parser.parse_args()
    out = Path(args.out)
    cells = []
    for size in args.sizes:
        for reply in args.replies:
            cell = run_cell(size, reply, args.steps, args.rounds, out / f"{size}_{reply}", args.floor)
            print(json.dumps(cell), flush=True)
            cells.append(cell)
    print(table(cells))
    (out / "results.json").write_text(json.dumps(cells, indent=2) + "\n")


if __name__ == "__main__":
    main()
