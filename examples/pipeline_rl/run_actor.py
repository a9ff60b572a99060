"""Pipeline RL actor: generate GRPO groups, assign credit, push SAW items to the run's Redis stream.

Run one per inference node (or several on one machine); each picks up new weights as the trainer
publishes them to the server it samples from::

    python examples/pipeline_rl/run_actor.py --redis-url redis://:TOKEN@127.0.0.1:6379/0 \
        --run-id demo --server-url http://127.0.0.1:8000 --model-dir MODEL_DIR

Without ``--server-url`` it samples from an embedded engine on ``--model-dir`` (fixed weights:
data generation, tests). SIGTERM/SIGINT stop it after the batch in hand is pushed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from task import make_client, rollout_source

from ludic.training.pipeline import run_pipeline_actor


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default=os.environ.get("LUDIC_REDIS_URL"), help="default $LUDIC_REDIS_URL")
    p.add_argument("--run-id", required=True)
    p.add_argument("--server-url", default=None, help="Ludic/vLLM server to sample from")
    p.add_argument("--model-dir", default=None, help="tokenizer (and embedded model without --server-url)")
    p.add_argument("--trainer-batch-size", type=int, default=64, help="items the trainer takes per step")
    p.add_argument("--prompts", type=int, default=4, help="prompts per pushed batch")
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--max-stream-len", type=int, default=100_000)
    p.add_argument("--num-batches", type=int, default=0, help="0: until stopped")
    p.add_argument("--seed", type=int, default=1, help="actors need distinct seeds (disjoint env seeds)")
    return p.parse_args(argv)


async def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.redis_url:
        raise SystemExit("pass --redis-url or set $LUDIC_REDIS_URL")
    client = make_client(server_url=args.server_url, model_dir=args.model_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stats = await run_pipeline_actor(
        source=rollout_source(client, prompts=args.prompts, group_size=args.group_size, seed=args.seed),
        redis_url=args.redis_url,
        run_id=args.run_id,
        trainer_batch_size=args.trainer_batch_size,
        max_staleness=args.max_staleness,
        max_stream_len=args.max_stream_len,
        num_batches=args.num_batches or None,
        stop=stop,
        policy_version_fn=client.get_policy_version,
    )
    print(f"actor {args.seed}: pushed {stats.items} items in {stats.batches} batches "
          f"(admission wait {stats.admission_wait_seconds:.1f} s)", flush=True)  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
