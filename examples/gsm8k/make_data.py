"""Write a tiny local GSM8K-style dataset (JSONL with ``question`` and ``answer`` = "... #### N").

Real GSM8K needs a download; this example ships its own generator so it runs offline. Problems
are one- or two-step word problems with small numbers; the format matches GSM8K's, so the same
code trains on the real dataset by pointing ``--data`` at a GSM8K JSONL file.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ["Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Ivy"]
ITEMS = ["apples", "pens", "books", "shells", "coins", "stickers"]


def make_problem(rng: random.Random) -> dict[str, str]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 9), rng.randint(1, 9)
    kind = rng.choice(["add", "sub", "mul"])
    if kind == "add":
        q = f"{name} has {a} {item} and finds {b} more. How many {item} does {name} have now?"
        ans, work = a + b, f"{a} + {b} = {a + b}"
    elif kind == "sub":
        a += b
        q = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
        ans, work = a - b, f"{a} - {b} = {a - b}"
    else:
        q = f"{name} buys {a} bags with {b} {item} in each bag. How many {item} is that?"
        ans, work = a * b, f"{a} * {b} = {a * b}"
    return {"question": q, "answer": f"{work}\n#### {ans}"}


def write_dataset(path: str | Path, *, n: int, seed: int) -> Path:
    """Write ``n`` problems to ``path`` (JSONL) and return it."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps(make_problem(rng)) + "\n")
    return path


def read_dataset(path: str | Path) -> list[dict[str, str]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def final_answer(answer: str) -> str:
    """The number after GSM8K's ``####`` marker."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer has no '####' marker: {answer!r}")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data/gsm8k_tiny")
    parser.add_argument("--train", type=int, default=512)
    parser.add_argument("--test", type=int, default=64)
    args = parser.parse_args()
    write_dataset(Path(args.out) / "train.jsonl", n=args.train, seed=0)
    write_dataset(Path(args.out) / "test.jsonl", n=args.test, seed=1)
    print(f"wrote {args.train} train and {args.test} test problems under {args.out}")
