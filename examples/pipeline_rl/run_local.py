"""Pipeline RL on one machine with real processes: Redis, an inference server, N actors, one trainer.

    python examples/pipeline_rl/run_local.py --actors 2 --steps 50

Starts a private Redis (``RedisServer``, append-only), ``python -m ludic.inference.server`` on a tiny model
(or ``--model-dir``), ``--actors`` copies of ``run_actor.py`` sampling from that server, and
``run_trainer.py``, which trains from the stream and pushes weights to the server every step. Stops
everything when the trainer is done (or on Ctrl-C).

On a CPU with the default tiny model (random weights, no warm start) this is a wiring demo: it shows the
processes, the stream, the weight pushes and the trainer's idle time, not learning (its reward was not
measured to rise). The pipeline run that learns on a CPU is ``ludic quickstart --pipeline`` (held-out
reward +0.76 to +0.79 on 3 seeds, ``bench/bench_pipeline.py learn``); pass ``--model-dir`` for a real model.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ludic.training.pipeline.redis_server import RedisServer, free_port

HERE = Path(__file__).resolve().parent


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"inference server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not up after {timeout_s} s") from None
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--model-dir", default=None, help="default: build a tiny model")
    p.add_argument("--output-dir", default="runs/pipeline_local")
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--prompts", type=int, default=2, help="prompts per actor batch")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--publish", choices=("blob", "gloo", "shm"), default="blob",
                   help="how the trainer sends weights to the server (run_trainer.py --publish)")
    args = p.parse_args(argv)
    if args.model_dir is not None:
        return run(args, args.model_dir)
    from ludic.testing import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="ludic-pipeline-model-") as scratch:  # the tiny model, removed after
        return run(args, str(build_tiny_model(Path(scratch))))


def run(args: argparse.Namespace, model_dir: str) -> int:
    """Redis, the server, the actors and the trainer on ``model_dir``; the trainer's exit code."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    batch = args.prompts * args.group_size
    procs: list[subprocess.Popen] = []
    with RedisServer() as redis:
        port = free_port()
        server_url = f"http://127.0.0.1:{port}"
        try:
            server = subprocess.Popen(
                [sys.executable, "-m", "ludic.inference.server", model_dir, "--port", str(port)], env=env
            )
            procs.append(server)
            wait_http(server_url, server)
            common = ["--redis-url", redis.url, "--run-id", "local", "--model-dir", model_dir,
                      "--server-url", server_url, "--max-staleness", str(args.max_staleness),
                      "--group-size", str(args.group_size)]  # fmt: skip
            for seed in range(1, args.actors + 1):
                procs.append(subprocess.Popen(
                    [sys.executable, str(HERE / "run_actor.py"), *common, "--seed", str(seed),
                     "--prompts", str(args.prompts), "--trainer-batch-size", str(batch)], env=env,
                ))  # fmt: skip
            trainer = subprocess.run(
                [sys.executable, str(HERE / "run_trainer.py"), *common, "--steps", str(args.steps),
                 "--batch-size", str(batch), "--output-dir", args.output_dir, "--resume",
                 "--publish", args.publish], env=env,
            )  # fmt: skip
            return trainer.returncode
        finally:
            for proc in reversed(procs):
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    raise SystemExit(main())
