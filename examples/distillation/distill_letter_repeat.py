"""On-policy distillation on the quickstart task: a student learns from a teacher's per-token scores.

Run: ``.venv/bin/python examples/distillation/distill_letter_repeat.py`` (a few minutes on a CPU).

1. A teacher is made by SFT on correct demonstrations until it solves "Repeat x 4 times."
2. A student (the same tiny model, a short SFT warm start: it rarely names the right letter) samples; the
   teacher scores the student's tokens and the loss is the per-token reverse KL to the teacher
   (``make_distill``). No environment reward is read: ``reward_coeff=0``.
3. The run itself is ``ludic train`` on ``examples/configs/distill_letter_repeat.toml``; the held-out
   reward it reports before and after shows what the teacher's scores alone taught the student.

``ludic train`` prints a short line every 10 steps (reward, loss) and writes every stat to
``<work>/out/metrics.jsonl``; the run ends with the held-out reward before -> after distillation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ludic.cli import main as ludic_main
from ludic.quickstart.demonstrations import demonstration_items
from ludic.testing import build_tiny_model
from ludic.training import OfflineBatchSource, Trainer, TrainerConfig, make_sft
from ludic.training.loggers import before_after

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "distill_letter_repeat.toml"
SFT_SEEDS = 500_000  # demonstrations use env seeds far from the rollout and eval seeds


def sft_model(base: Path, out: Path, *, steps: int, letters: str, count: int, lr: float = 1e-3) -> Path:
    """``base`` fine-tuned for ``steps`` steps of 16 demonstrations, saved (with its tokenizer) at ``out``."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    if steps:
        seeds = range(SFT_SEEDS, SFT_SEEDS + 16 * steps)
        items = demonstration_items(tokenizer, seeds=seeds, count=count, letters=letters)
        cfg = TrainerConfig(lr=lr, max_seq_len=128, micro_token_budget=4096, seed=0)
        trainer = Trainer(model=model, algo=make_sft(), batch_source=OfflineBatchSource(items, batch_size=16), cfg=cfg)
        asyncio.run(trainer.train(steps))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def prepare(work: Path, *, teacher_steps: int = 100, student_steps: int = 25, letters: str = "abcdefgh",
            count: int = 4) -> tuple[Path, Path]:  # fmt: skip
    """(teacher, student) model directories under ``work``."""
    torch.manual_seed(0)
    base = build_tiny_model(work / "base", seed=0)
    teacher = sft_model(base, work / "teacher", steps=teacher_steps, letters=letters, count=count)
    student = sft_model(base, work / "student", steps=student_steps, letters=letters, count=count)
    return teacher, student


def write_config(
    work: Path, teacher: Path, student: Path, *, steps: int, eval_episodes: int = 64, name: str = "distill"
) -> Path:
    """The example config with its model paths, step count and output folder filled in: ``work/<name>.toml``."""
    text = CONFIG.read_text()
    for old, new in {
        'path = "runs/distill/student"': f'path = "{student}"',
        'teacher = "runs/distill/teacher"': f'teacher = "{teacher}"',
        'output_dir = "runs/distill/out"': f'output_dir = "{work / "out"}"',
        "steps = 40": f"steps = {steps}",
        "num_episodes = 64": f"num_episodes = {eval_episodes}",
    }.items():
        if old not in text:
            raise RuntimeError(f"{CONFIG} no longer contains {old!r}; update write_config")
        text = text.replace(old, new)
    path = work / f"{name}.toml"
    path.write_text(text)
    return path


def held_out_reward(config: Path) -> float:
    """``ludic eval`` on the config's model: mean held-out reward."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ludic_main(["eval", str(config)])
    return float(json.loads(buf.getvalue())["eval/avg_total_reward"])


def run(work: Path, *, steps: int = 40, eval_episodes: int = 64, **prepare_kwargs: object) -> dict[str, float]:
    """Teacher and student held-out reward, then the student's after ``steps`` of distillation."""
    teacher, student = prepare(work, **prepare_kwargs)  # type: ignore[arg-type]
    kw = {"steps": steps, "eval_episodes": eval_episodes}
    result = {
        "teacher": held_out_reward(write_config(work, teacher, teacher, name="teacher", **kw)),
        "student_before": held_out_reward(write_config(work, teacher, student, name="student", **kw)),
    }
    ludic_main(["train", str(write_config(work, teacher, student, **kw))])
    after = write_config(work, teacher, work / "out" / "final_model", name="distilled", **kw)
    result["student_after"] = held_out_reward(after)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("runs/distill"))
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    result = run(args.work, steps=args.steps)
    print(f"[distill] teacher's held-out reward {result['teacher']:.3f}")
    print(before_after(f"student's held-out reward over {args.steps} distillation steps:",
                       result["student_before"], result["student_after"], prefix="[distill]"))  # fmt: skip
    print(f"[distill] every stat per step: {args.work / 'out' / 'metrics.jsonl'}")
