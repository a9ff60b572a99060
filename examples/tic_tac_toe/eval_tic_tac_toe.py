"""Evaluate a model at Tic-Tac-Toe (greedy): win, draw and illegal-move rates over held-out games.

python examples/tic_tac_toe/eval_tic_tac_toe.py --model runs/tic_tac_toe/final_model
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_tic_tac_toe import REDUCERS, add_common_args, run_config

from ludic.cli.run_config import eval_from_config


def main() -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(p)
    stats = eval_from_config(run_config(p.parse_args()), REDUCERS)
    print(json.dumps(stats, indent=2))
    return stats


if __name__ == "__main__":
    main()
