"""Publishing weights to a server in another process: gloo broadcast vs the HTTP safetensors blob, in GB/s,
beside an in-memory copy of the same bytes on the same machine (the limit).

For each size (about 1M, 25M and 100M parameters, fp32) a real ``python -m ludic.inference.server``
subprocess serves a Qwen2 of that size; the variants run interleaved, ``--repeats`` times each, and the
median is reported. "broadcast" is ``BroadcastPolicyPublisher.publish`` end to end: the HTTP control
calls, packed 256 MB buckets over gloo on loopback, the server's staging, validation (NaN check)
and load into its model. "blob" is ``ClientPublisher`` over ``VLLMChatClient.sync_weights``:
safetensors serialisation, one HTTP upload, parse, validation, load. Goal (issue 10): broadcast >=
0.3x the in-memory copy.
Run: ``.venv/bin/python bench/bench_publish.py [--sizes 1M 25M 100M --repeats 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch
from transformers import AutoModelForCausalLM

from ludic.distributed import BroadcastPolicyPublisher, ClientPublisher
from ludic.inference import VLLMChatClient
from ludic.testing import build_tiny_model
from ludic.testing.server_process import running_server

SIZES = {"1M": dict(hidden_size=160, num_layers=4, intermediate_size=480),
         "25M": dict(hidden_size=512, num_layers=8, intermediate_size=1536),
         "100M": dict(hidden_size=1024, num_layers=8, intermediate_size=3072)}  # fmt: skip


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_size(label: str, repeats: int, root: Path) -> dict[str, float]:
    model_dir = build_tiny_model(root / label, seed=0, **SIZES[label])
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    state = model.state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    params = sum(p.numel() for p in model.parameters())
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in once: the copy below is memory bandwidth, not first touch
    times: dict[str, list[float]] = {"copy": [], "broadcast": [], "blob": []}
    with running_server(model_dir, ["--transfer-timeout", "600"]) as url:
        client = VLLMChatClient(base_url=url, enable_weight_updates=True, timeout_s=600)
        bcast = BroadcastPolicyPublisher(client, timeout_s=600)
        blob = ClientPublisher(client, timeout_s=600)
        bcast.publish(state, version=0)  # set-up (group join) and warm-up, not timed
        version = 1
        for _ in range(repeats):
            times["copy"].append(timed(lambda: dst.copy_(src)))
            times["broadcast"].append(timed(lambda v=version: bcast.publish(state, version=v)))
            times["blob"].append(timed(lambda v=version: blob.publish(state, version=v + 1)))
            version += 2
        bcast.close()
    gbps = {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
    print(f"{label:>5} ({params / 1e6:.1f}M params, {nbytes / 1e6:.0f} MB): copy {gbps['copy']:.2f} GB/s | "
          f"broadcast {gbps['broadcast']:.2f} GB/s ({gbps['broadcast'] / gbps['copy']:.2f}x copy) | "
          f"blob {gbps['blob']:.2f} GB/s ({gbps['blob'] / gbps['copy']:.2f}x copy) | "
          f"broadcast/blob {gbps['broadcast'] / gbps['blob']:.2f}x", flush=True)  # fmt: skip
    return gbps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"median of {args.repeats} interleaved runs; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    with tempfile.TemporaryDirectory() as tmp:
        for label in args.sizes:
            bench_size(label, args.repeats, Path(tmp))


if __name__ == "__main__":
    main()
