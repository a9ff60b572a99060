"""Evaluate a model on the local GSM8K-style test split (greedy), through ``ludic.eval.Evaluator``.

python examples/gsm8k/eval_gsm8k.py --model runs/gsm8k/final_model
python examples/gsm8k/eval_gsm8k.py --model M --server-url http://127.0.0.1:8000  # python -m ludic.inference.server M, or vLLM
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_gsm8k import add_common_args, run_config

from ludic.cli.run_config import eval_from_config


def main() -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(p)
    args = p.parse_args()
    stats = eval_from_config(run_config(args))
    print(json.dumps(stats, indent=2))
    return stats


if __name__ == "__main__":
    main()
