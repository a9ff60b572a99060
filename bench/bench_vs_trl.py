"""Side by side: Ludic GRPO vs TRL's GRPOTrainer, same tiny model, same task, same knobs, on the CPU.

Both start from the same SFT-warmed tiny model (warm-started once, with Ludic) and train with
the same group size, prompts per step, completion length, learning rate (linear warm-up, linear decay, no KL) and
number of steps on the quickstart letter task. Both are then scored by the same held-out
evaluation (Ludic's Evaluator on the embedded engine). Prints seconds per step, mean training
reward over the last tenth of the steps, and held-out eval reward for each.

    OMP_NUM_THREADS=2 OMP_WAIT_POLICY=ACTIVE .venv/bin/python bench/bench_vs_trl.py --steps 100 --seeds 0 1 2

Needs the bench extra: ``pip install -e '.[bench]'`` (trl, datasets). The speed curve over model
sizes and reply lengths is ``bench_vs_trl_curve.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from ludic.envs.letter_repeat import letter_for_seed, letter_repeat_reward, prompt_for
from ludic.quickstart.config import QuickstartConfig
from ludic.quickstart.run import build_quickstart_run
from ludic.quickstart.run_config import run_config_data, to_run_config
from ludic.quickstart.warm_start import save_warm_model, warm_start
from ludic.training.loggers.plot import read_metrics, series


def last_tenth_mean(values: list[float]) -> float:
    tail = values[-max(len(values) // 10, 1) :]
    return sum(tail) / len(tail)


def run_config(cfg: QuickstartConfig, model_dir: Path, out: Path) -> Any:
    """The quickstart's run config (what ``ludic quickstart`` trains with), starting at ``model_dir``."""
    return to_run_config(run_config_data(dataclasses.replace(cfg, output_dir=str(out)), model_dir))


async def held_out_eval(cfg: QuickstartConfig, model_dir: Path, out: Path) -> float:
    from ludic.cli.runtime import make_client, make_engine, make_evaluator

    run_cfg = run_config(cfg, model_dir, out)
    engine = make_engine(run_cfg, make_client(run_cfg), run_cfg.eval.sampling.to_sampling())
    stats = await make_evaluator(run_cfg, engine, out).evaluate(step=cfg.steps)
    return stats["eval/avg_total_reward"]


async def prepare_warm_model(cfg: QuickstartConfig, out: Path) -> Path:
    run, _ = build_quickstart_run(cfg)
    await warm_start(cfg, run)
    return save_warm_model(run, out / "warm_model")


async def run_ludic(cfg: QuickstartConfig, warm: Path, out: Path) -> dict[str, float]:
    from ludic.cli.run_config import build_train_run, train_steps

    run = build_train_run(run_config(cfg, warm, out))  # as ludic quickstart builds its RL phase
    start = time.perf_counter()
    await train_steps(run)
    seconds = time.perf_counter() - start
    _, rewards = series(read_metrics(out / "metrics.jsonl"), "train/avg_total_reward")
    final = out / "final_model"
    run.trainer.model.save_pretrained(final)
    run.client.tokenizer.save_pretrained(final)
    return {
        "seconds_per_step": seconds / cfg.steps,
        "train_reward_last_tenth": last_tenth_mean(rewards),
        "eval_reward": await held_out_eval(cfg, final, out / "eval"),
    }


def trl_reward_fn(max_tokens: int, eos_id: int, count: int) -> Any:
    """Same reward as the Ludic env; a completion cut at max_tokens scores 0, as a Ludic parse failure."""

    def reward(completions: list, completion_ids: list, letter: list, **_: Any) -> list[float]:
        out = []
        for comp, ids, want in zip(completions, completion_ids, letter):
            text = comp[0]["content"] if isinstance(comp, list) else comp
            cut = len(ids) >= max_tokens and (not ids or ids[-1] != eos_id)
            out.append(0.0 if cut else letter_repeat_reward(text, want, count))
        return out

    return reward


def trl_grpo_args(cfg: QuickstartConfig, out: Path, *, steps: int | None = None, warmup_steps: int | None = None) -> Any:
    """TRL's GRPOConfig set as close to Ludic's ``make_grpo`` and the quickstart's knobs as it goes."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        report_to="none",
        max_steps=cfg.steps if steps is None else steps,
        seed=cfg.seed,
        learning_rate=cfg.lr,
        lr_scheduler_type="linear",
        warmup_steps=cfg.warmup_steps if warmup_steps is None else warmup_steps,
        beta=0.0,
        weight_decay=0.0,
        num_generations=cfg.group_size,
        per_device_train_batch_size=cfg.group_size * cfg.prompts_per_step,
        max_completion_length=cfg.max_new_tokens,
        temperature=1.0,
        logging_steps=1,
        save_strategy="no",
        shuffle_dataset=False,
        max_grad_norm=1.0,
        bf16=False,
        dataloader_num_workers=0,
        # the closest TRL settings to Ludic's make_grpo: per-sequence token sums (a constant
        # normaliser), clip 0.2/0.27, group std scaling; no activation checkpointing (TRL's default
        # is on; Ludic's is off), so both run the same forward and backward
        loss_type="dr_grpo",
        epsilon=0.2,
        epsilon_high=0.27,
        scale_rewards="group",
        gradient_checkpointing=False,
    )


def run_trl(cfg: QuickstartConfig, warm: Path, out: Path) -> dict[str, float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(warm)
    seeds = range(cfg.seed * 100_000, cfg.seed * 100_000 + cfg.steps * cfg.prompts_per_step)
    letters = [letter_for_seed(s, cfg.letters) for s in seeds]
    data = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": prompt_for(x, cfg.count)}] for x in letters],
            "letter": letters,
        }
    )
    args = trl_grpo_args(cfg, out)
    model = AutoModelForCausalLM.from_pretrained(warm)
    reward = trl_reward_fn(cfg.max_new_tokens, int(tokenizer.eos_token_id), cfg.count)
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    rewards = [float(row["reward"]) for row in trainer.state.log_history if "reward" in row]
    final = out / "final_model"
    trainer.model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    return {
        "seconds_per_step": seconds / cfg.steps,
        "train_reward_last_tenth": last_tenth_mean(rewards),
        "eval_reward": asyncio.run(held_out_eval(cfg, final, out / "eval")),
    }


# The comparison's own knobs (the README's figures), kept apart from the quickstart's defaults.
BENCH_KNOBS = {"group_size": 8, "prompts_per_step": 4, "max_new_tokens": 16, "lr": 1e-3}


def run_seed(seed: int, steps: int, out: Path, skip_trl: bool) -> dict[str, dict[str, float]]:
    cfg = QuickstartConfig(
        steps=steps, seed=seed, output_dir=str(out / "setup"), live=False, eval_every=0, **BENCH_KNOBS
    )
    warm = asyncio.run(prepare_warm_model(cfg, out))
    results = {"start": {"eval_reward": asyncio.run(held_out_eval(cfg, warm, out / "eval_start"))}}
    results["ludic"] = asyncio.run(run_ludic(cfg, warm, out / "ludic"))
    if not skip_trl:
        results["trl"] = run_trl(cfg, warm, out / "trl")
    return results


def mean_of(per_seed: dict[int, dict[str, dict[str, float]]], side: str, key: str) -> float:
    values = [r[side][key] for r in per_seed.values() if side in r]
    return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/bench_vs_trl")
    parser.add_argument("--skip-trl", action="store_true", help="only run the Ludic side")
    args = parser.parse_args()
    out = Path(args.out)
    per_seed = {seed: run_seed(seed, args.steps, out / f"seed{seed}", args.skip_trl) for seed in args.seeds}
    sides = ["ludic"] + ([] if args.skip_trl else ["trl"])
    keys = ("seconds_per_step", "train_reward_last_tenth", "eval_reward")
    summary = {side: {k: mean_of(per_seed, side, k) for k in keys} for side in sides}
    summary["start"] = {"eval_reward": mean_of(per_seed, "start", "eval_reward")}
    if not args.skip_trl:
        ratios = [r["trl"]["seconds_per_step"] / r["ludic"]["seconds_per_step"] for r in per_seed.values()]
        summary["speedup (trl s/step / ludic s/step)"] = {
            "mean": sum(ratios) / len(ratios),
            "min": min(ratios),
        }
    knobs = {"steps": args.steps, "seeds": args.seeds} | BENCH_KNOBS
    report = {"knobs": knobs, "per_seed": per_seed, "mean over seeds": summary}
    print(json.dumps(report, indent=2))
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
