"""GRPO on a tiny local GSM8K-style dataset, driven through Ludic's run-config API.

    python examples/gsm8k/train_gsm8k.py --steps 20                      # tiny model, CPU
    python examples/gsm8k/train_gsm8k.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda
    python examples/gsm8k/train_gsm8k.py --model M --server-url http://127.0.0.1:8000  # python -m ludic.inference.server M, or vLLM

The same run as a config file: see ``examples/configs/``; ``ludic train`` reads those.

On the default tiny model this is a wiring demo: a ~0.8M-parameter model does not learn grade-school
arithmetic, so the reward stays near 0. It needs a real model (``--model``) to show learning.

It prints a short line every 10 steps (reward, loss), writes every stat to ``<output-dir>/metrics.jsonl``
and ends with the held-out reward (greedy) of the starting model and of the trained one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gsm8k_env  # noqa: F401  (registers the "gsm8k_local" env)
from make_data import write_dataset

from ludic.cli.run_config import eval_from_config, train_from_config
from ludic.config import parse_config
from ludic.training.loggers import before_after


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model directory or hub name (default: build a tiny model)")
    p.add_argument(
        "--server-url",
        default=None,
        help="OpenAI-compatible server URL (python -m ludic.inference.server, or vLLM with return_token_ids)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--output-dir", default="runs/gsm8k")
    p.add_argument("--data", default=None, help="directory with train.jsonl/test.jsonl (default: generate)")
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=48)


def run_config(args: argparse.Namespace, **extra: Any) -> Any:
    """A RunConfig for this example, built from flags (validated like a config file)."""
    out = Path(args.output_dir)
    data = Path(args.data) if args.data else out / "data"
    if not args.data:
        write_dataset(data / "train.jsonl", n=256, seed=0)
        write_dataset(data / "test.jsonl", n=64, seed=1)
    model = args.model
    if model is None:
        from ludic.testing import build_tiny_model

        model = str(build_tiny_model(out / "tiny_model", seed=0))
    sampling = {"temperature": 1.0, "max_tokens": args.max_new_tokens}
    inference = {"backend": "server", "server_url": args.server_url} if args.server_url else {}
    raw = {
        "model": {"path": model, "device": args.device},
        "env": {"name": "gsm8k_local", "kwargs": {"path": str(data / "train.jsonl")}},
        "inference": inference,
        "eval": {
            "num_episodes": args.eval_episodes,
            "seed_offset": 0,
            "sampling": {**sampling, "temperature": 0.0},
            "env_kwargs": {"path": str(data / "test.jsonl")},
        },
        "rollout": {"sampling": sampling},
        "logging": {"output_dir": str(out), "rich": False},
        **extra,
    }
    return parse_config(raw, file="train_gsm8k.py flags")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-5)
    args = p.parse_args()
    cfg = run_config(
        args,
        steps=args.steps,
        algorithm={"name": "grpo"},
        trainer={"lr": args.lr, "max_seq_len": 512, "micro_token_budget": 8192},
    )
    cfg.rollout.group_size = args.group_size
    cfg.rollout.prompts_per_step = args.prompts_per_step
    after = train_from_config(cfg)["eval/avg_total_reward"]  # the trained policy, evaluated at the end
    before = eval_from_config(cfg)["eval/avg_total_reward"]  # [model].path: the model training started from
    print(before_after(f"held-out reward over {args.steps} GRPO steps:", before, after, prefix="[gsm8k]"))
    print(f"[gsm8k] every stat per step: {Path(args.output_dir) / 'metrics.jsonl'}")


if __name__ == "__main__":
    main()
