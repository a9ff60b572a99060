"""Evaluate a model at Tic-Tac-Toe (greedy): win, draw and bad-move rates over held-out games.

.venv/bin/python examples/tic_tac_toe/eval_tic_tac_toe.py --model runs/tic_tac_toe/final_model
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_tic_tac_toe import EVAL_SEEDS, build_engine, game, summarise

from ludic.eval import Evaluator
from ludic.inference import SamplingConfig, TransformersChatClient


async def evaluate(model: str, *, device: str, games: int, opponent: str, max_turns: int = 9) -> dict[str, float]:
    engine = build_engine(TransformersChatClient(model, device=device, model_name="policy"), "policy")
    greedy = SamplingConfig(temperature=0.0, max_tokens=16)
    requests = [game(EVAL_SEEDS + i, opponent, greedy) for i in range(games)]
    evaluator = Evaluator(engine=engine, requests=requests, max_steps=max_turns, concurrency=games)
    await evaluator.evaluate()
    return summarise(evaluator.last_rollouts)


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a save_pretrained directory (e.g. runs/tic_tac_toe/final_model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--games", type=int, default=256)
    p.add_argument("--opponent", default="random", choices=["random", "heuristic"])
    p.add_argument("--max-turns", type=int, default=9, help="model calls per game, retries included")
    args = p.parse_args(argv)
    stats = asyncio.run(
        evaluate(args.model, device=args.device, games=args.games, opponent=args.opponent, max_turns=args.max_turns)
    )
    print(json.dumps(stats, indent=2))
    return stats


if __name__ == "__main__":
    main()
