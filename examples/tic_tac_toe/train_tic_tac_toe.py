"""Tic-Tac-Toe against a bot: SFT warm start on heuristic games, GRPO, then evaluation (win rate).

    python examples/tic_tac_toe/train_tic_tac_toe.py --steps 30              # tiny model, CPU
    python examples/tic_tac_toe/train_tic_tac_toe.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda
    python examples/tic_tac_toe/train_tic_tac_toe.py --model M --server-url http://127.0.0.1:8000  # python -m ludic.inference.server M, or vLLM

Wiring is by name through Ludic's registries (env ``tic_tac_toe``, harness ``xml_move``,
protocol ``single_agent``, algorithm ``grpo``) and the run-config API that ``ludic train`` uses.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demonstrations import demonstration_items

from ludic.cli.run_config import eval_from_config, sft_to_dir, train_from_config
from ludic.config import parse_config
from ludic.training.stats import Reducer

REDUCERS = {
    "win_rate": Reducer(
        kind="count_true", source="result", transform=lambda r: r == "win", normalize_by="rollouts"
    ),
    "draw_rate": Reducer(
        kind="count_true", source="result", transform=lambda r: r == "draw", normalize_by="rollouts"
    ),
    "illegal_move_rate": Reducer(kind="count_true", source="illegal_move", normalize_by="samples"),
}


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model directory or hub name (default: build a tiny model)")
    p.add_argument(
        "--server-url",
        default=None,
        help="OpenAI-compatible server URL (python -m ludic.inference.server, or vLLM with return_token_ids)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--output-dir", default="runs/tic_tac_toe")
    p.add_argument("--opponent", default="random", choices=["random", "heuristic"])
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=16)


def run_config(args: argparse.Namespace, **extra: Any) -> Any:
    """A validated RunConfig for this example, from the flags."""
    out = Path(args.output_dir)
    model = args.model
    if model is None:
        from ludic.testing import build_tiny_model

        model = str(build_tiny_model(out / "tiny_model", seed=0))
    sampling = {"temperature": 1.0, "max_tokens": args.max_new_tokens}
    raw = {
        "model": {"path": model, "device": args.device},
        "env": {"name": "tic_tac_toe", "kwargs": {"opponent": args.opponent}},
        "harness": {"name": "xml_move", "kwargs": {"tag": "move"}},
        "inference": {"backend": "server", "server_url": args.server_url} if args.server_url else {},
        "rollout": {"max_steps": 6, "sampling": sampling},
        "eval": {"num_episodes": args.eval_episodes, "sampling": {**sampling, "temperature": 0.0}},
        "trainer": {"max_seq_len": 1024, "micro_token_budget": 8192},
        "logging": {"output_dir": str(out), "rich": False},
        **extra,
    }
    return parse_config(raw, file="train_tic_tac_toe.py flags")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--steps", type=int, default=30, help="GRPO steps")
    p.add_argument("--sft-steps", type=int, default=20, help="SFT warm-start steps (0 to skip)")
    p.add_argument("--sft-games", type=int, default=64, help="heuristic games used as demonstrations")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4)
    args = p.parse_args()
    cfg = run_config(args, steps=args.steps, algorithm={"name": "grpo"})
    cfg.rollout.group_size, cfg.rollout.prompts_per_step = args.group_size, args.prompts_per_step
    cfg.trainer.lr = cfg.trainer.learning_rate = args.lr
    if args.sft_steps:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        items = demonstration_items(tokenizer, seeds=range(10_000, 10_000 + args.sft_games))
        warm = Path(args.output_dir) / "sft_model"
        sft_to_dir(cfg, items, steps=args.sft_steps, batch_size=16, lr=1e-3, out_dir=warm)
        cfg.model.path = str(warm)
    print(json.dumps({"before": eval_from_config(cfg, REDUCERS)}, indent=2))
    print(json.dumps({"after": train_from_config(cfg, REDUCERS)}, indent=2))


if __name__ == "__main__":
    main()
