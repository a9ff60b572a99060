"""FSDP2 on CPU: training tokens/s and peak memory per rank, 1 process vs 2 (gloo), same global batch;
and the publish path's peak extra memory (layer-wise gather) against a full-state-dict gather.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_fsdp.py [--repeats 3] [--hidden 256 --layers 4]

Each variant runs in fresh processes (``torchrun --nproc_per_node=2`` for FSDP2), variants interleaved,
``--repeats`` times; medians printed. Memory is the rise of the process's peak RSS (``VmHWM``, reset
through ``/proc/self/clear_refs``) over its RSS before the measured section, per rank (glibc told to
mmap large blocks and trimmed first, so freed memory does not hide new allocations). On a GPU the
same figures would come from ``torch.cuda.max_memory_allocated`` (not run here: no GPU).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _vm(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1]) / 1024  # kB -> MiB
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> float:
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back, so new allocations show in RSS
    Path("/proc/self/clear_refs").write_text("5")
    return _vm("VmRSS")


def batch(step: int, n: int, length: int, vocab: int):
    from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWBatch, SAWItem

    rng = random.Random(step)
    items = []
    for i in range(n):
        m = rng.randint(length // 2, length)
        items.append(SAWItem(input_ids=[rng.randrange(3, vocab) for _ in range(m)], attention_mask=[1] * m,
                             action_mask=[0] * 8 + [1] * (m - 8), weight=rng.uniform(-1, 1),
                             attachments=SampleAttachments(ActorTokenLogps([-1.0] * (m - 8))),
                             meta={"rollout_id": f"{step}-{i}"}))  # fmt: skip
    return SAWBatch(items=items)


def worker(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from ludic.training import RLAlgorithm, Trainer, TrainerConfig
    from ludic.training.credit.assigners import EpisodicReturn
    from ludic.training.loss import ReinforceLoss
    from ludic.training.parallel.publish import gather_publishable

    distributed = "RANK" in os.environ
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    if distributed:
        from ludic.training.parallel.fsdp import init_distributed, shard_model

        init_distributed("gloo")
        shard_model(model)
    steps = {"n": 0}

    class Source:
        async def next_batch(self):
            steps["n"] += 1
            return batch(steps["n"], args.batch, args.seq_len, model.config.vocab_size)

    algo = RLAlgorithm(name="reinforce", credit_assigner=EpisodicReturn(), loss=ReinforceLoss())
    cfg = TrainerConfig(lr=1e-4, max_seq_len=args.seq_len, micro_token_budget=args.seq_len * 8,
                        sync_every_steps=0, share_prompt_prefix=False)  # fmt: skip
    trainer = Trainer(model=model, algo=algo, batch_source=Source(), cfg=cfg)
    trainer.train_step_sync()  # warm-up
    base = reset_peak()
    t0 = time.perf_counter()
    tokens = 0.0
    for _ in range(args.steps):
        tokens += trainer.train_step_sync()["perf/real_tokens"]
    seconds = time.perf_counter() - t0
    train_peak = _vm("VmHWM") - base
    out = {"tokens_per_s": tokens / seconds, "train_peak_mb": train_peak}
    if args.publish == "layerwise":
        base = reset_peak()
        state = gather_publishable(trainer.model)
        out["publish_peak_mb"] = _vm("VmHWM") - base
        out["payload_mb"] = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    elif args.publish == "full":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        base = reset_peak()
        state = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True))
        out["publish_peak_mb"] = _vm("VmHWM") - base
    rank = int(os.environ.get("RANK", "0"))
    Path(f"{args.out}.rank{rank}.json").write_text(json.dumps(out))
    if distributed:
        torch.distributed.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: argparse.Namespace, nproc: int, publish: str, out: str) -> list[dict]:
    if nproc == 1:
        cmd = [sys.executable, __file__]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__]  # fmt: skip
    cmd += ["--worker", "--model", args.model, "--out", out, "--publish", publish, "--steps", str(args.steps),
            "--batch", str(args.batch), "--seq-len", str(args.seq_len)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "MALLOC_MMAP_THRESHOLD_": "65536"}  # large tensors mmap'd: freed memory leaves RSS at once
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(nproc)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--model")
    ap.add_argument("--out")
    ap.add_argument("--publish", default="none", choices=["none", "layerwise", "full"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from ludic.testing import build_tiny_model

    tmp = tempfile.mkdtemp(prefix="bench-fsdp-")
    args.model = str(build_tiny_model(Path(tmp) / "m", hidden_size=args.hidden, num_layers=args.layers,
                                      intermediate_size=3 * args.hidden))  # fmt: skip
    runs: dict[str, list[list[dict]]] = {"1 process": [], "2 FSDP2 ranks, layer-wise publish": [],
                                         "2 FSDP2 ranks, full gather": []}  # fmt: skip
    for rep in range(args.repeats):  # interleaved: the machine is shared and noisy
        runs["1 process"].append(launch(args, 1, "none", f"{tmp}/one{rep}"))
        runs["2 FSDP2 ranks, layer-wise publish"].append(launch(args, 2, "layerwise", f"{tmp}/lw{rep}"))
        runs["2 FSDP2 ranks, full gather"].append(launch(args, 2, "full", f"{tmp}/fg{rep}"))
    med = statistics.median
    print(f"model: hidden {args.hidden}, {args.layers} layers; global batch {args.batch} x <= {args.seq_len} "
          f"tokens; {args.steps} steps x {args.repeats} repeats (medians); CPU, shared machine")  # fmt: skip
    for name, reps in runs.items():
        for r in range(len(reps[0])):
            tps = med(x[r]["tokens_per_s"] for x in reps)
            peak = med(x[r]["train_peak_mb"] for x in reps)
            line = f"{name:36s} rank {r}: {tps:8.0f} global tok/s  train peak +{peak:6.1f} MiB"
            if "publish_peak_mb" in reps[0][r]:
                line += f"  publish peak +{med(x[r]['publish_peak_mb'] for x in reps):6.1f} MiB"
            print(line)
    one = med(x[0]["tokens_per_s"] for x in runs["1 process"])
    two = med(x[0]["tokens_per_s"] for x in runs["2 FSDP2 ranks, layer-wise publish"])
    print(f"global tokens/s, 2 ranks / 1 process: {two / one:.2f}x (reduced tokens/s is the same on every rank)")
    lw = [med(x[r]["publish_peak_mb"] for x in runs["2 FSDP2 ranks, layer-wise publish"]) for r in (0, 1)]
    fg = [med(x[r]["publish_peak_mb"] for x in runs["2 FSDP2 ranks, full gather"]) for r in (0, 1)]
    payload = runs["2 FSDP2 ranks, layer-wise publish"][0][0]["payload_mb"]
    print(f"publish peak extra memory, layer-wise / full gather: rank 0 {lw[0] / fg[0]:.2f}x, "
          f"rank 1 {lw[1] / max(fg[1], 1e-9):.2f}x (model {payload:.1f} MiB)")  # fmt: skip


if __name__ == "__main__":
    main()
