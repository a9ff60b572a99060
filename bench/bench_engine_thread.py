"""GRPO step time with the embedded engine decoding on a worker thread vs on the event loop's thread.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_engine_thread.py --rounds 3 --steps 10

``examples/minimal_grpo.py``'s loop (replies of up to 16 tokens); same tiny model, task and seeds for both
settings; rounds interleave them (False, True, False, ...) and the medians of the per-round mean s/step
are compared. Figure for the
``TransformersChatClient(generate_in_thread=...)`` docstring.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from transformers import AutoModelForCausalLM

from ludic.inference import TransformersChatClient
from ludic.testing import build_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from minimal_grpo import grpo_trainer  # the task and loop timed here


async def seconds_per_step(model_dir: str, in_thread: bool, steps: int) -> float:
    client = TransformersChatClient(model_dir, generate_in_thread=in_thread)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trainer = grpo_trainer(model, client, max_tokens=16, seed=0)
    await trainer.train(2)  # warm-up
    t0 = time.perf_counter()
    await trainer.train(steps)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-thread-"), seed=0))
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds):
        for in_thread in (False, True) if r % 2 == 0 else (True, False):
            times[in_thread].append(asyncio.run(seconds_per_step(model_dir, in_thread, args.steps)))
            print(f"round {r} generate_in_thread={in_thread}: {times[in_thread][-1]:.4f} s/step", flush=True)
    loop, thread = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"median s/step: loop thread {loop:.4f}, worker thread {thread:.4f}: worker/loop = {thread / loop:.2f}x"
    )


if __name__ == "__main__":
    main()
