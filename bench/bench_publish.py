"""Publishing weights to a server in another process: gloo broadcast vs the HTTP safetensors blob, in GB/s,
beside an in-memory copy of the same bytes (the limit) and a plain gloo broadcast of one flat tensor of
the same size (the collective's own ceiling), with the broadcast publish split into its stages.

For each size (about 1M, 25M and 100M parameters, fp32) real ``python -m ludic.inference.server``
subprocesses serve a Qwen2 of that size, one per publisher below, so each server sees the same layout
every time (as in training) and receives into warm buffers. Per repeat, interleaved:
- "copy": one ``dst.copy_(src)`` of the same number of bytes in this process (torch's own copy, its
  OpenMP threads included); "copy, 1 thread": the same on one thread, back to back until >= 256 MB were
  copied, per copy (a small copy's bandwidth without the thread wake-up a single small call pays on a
  loaded machine; at 1.3M, 5 MB fits the 32 MB L3 cache, so that copy is partly a cache copy). The limit
  is the faster of the two medians.
- "raw cK": gloo ``broadcast`` of one flat uint8 tensor of that size on loopback from this process to a
  helper subprocess (this script with ``--raw-receiver``) over K connections (``channels``: the tensor
  split into K parts sent at once), timed until the receiver acknowledges: the collective's own ceiling.
- "tcp socket": the same bytes over one plain TCP connection (Python ``sendall`` / ``recv_into``, no
  gloo), acknowledged the same way: what loopback TCP itself gives.
- "broadcast cK": ``BroadcastPolicyPublisher(channels=K).publish`` end to end (pause, the control calls,
  256 MB buckets over gloo, the server's staging, NaN check and load, resume), packing overlapped with
  sending.
- "serial": broadcast c<first K> with ``overlap=False``: one stage at a time, so each stage's time is its own.
- "flat": serial, with every tensor packed into one buffer (a copy of every byte) sent as one bucket:
  one broadcast of one flat tensor between the same two processes, whose time inside the server
  (``server_receive_s``) is reported as "raw_same".
- "shm": ``BroadcastPolicyPublisher(backend="shm").publish`` end to end (the same pause and control calls,
  256 MB buckets, each packed by the trainer straight into a shared-memory buffer of the server's, which
  checks and adopts it: one copy of every byte, no socket; ``ludic.inference.weight_sync.shared_memory``).
- "blob": ``ClientPublisher`` over ``VLLMChatClient.sync_weights`` (safetensors, one HTTP upload).
Medians are reported, with the stages (trainer side and the server's own timings) of the serial publish
and of the shm publish. Goal (issue 10): publish >= 0.3x the in-memory copy.
Run: ``.venv/bin/python bench/bench_publish.py [--sizes 100M 25M 1M --repeats 5 --channels 1 2 4]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch
from transformers import AutoModelForCausalLM

from ludic.distributed import BroadcastPolicyPublisher, ClientPublisher
from ludic.inference import VLLMChatClient
from ludic.inference.weight_sync.process_group import broadcast_all, create_group, free_port
from ludic.testing import build_tiny_model
from ludic.testing.server_process import running_server

SIZES = {"1M": dict(hidden_size=160, num_layers=4, intermediate_size=480),
         "25M": dict(hidden_size=512, num_layers=8, intermediate_size=1536),
         "100M": dict(hidden_size=1024, num_layers=8, intermediate_size=3072)}  # fmt: skip
STAGES = ("publish_pack_s", "publish_wait_s", "publish_control_s", "server_receive_s", "server_check_s",
          "server_check_wait_s", "server_load_s", "server_alloc_bytes")  # fmt: skip
TIMEOUT = timedelta(seconds=600)


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class RawBroadcast:
    """One flat tensor from this process (rank 0) to a helper subprocess (rank 1) over gloo on
    ``channels`` connections; the helper acknowledges each receipt with a one-byte broadcast back, so
    the time covers the whole transfer."""

    def __init__(self, nbytes: int, rounds: int, channels: int) -> None:
        port = free_port()
        cmd = [sys.executable, __file__, "--raw-receiver", str(port), str(nbytes), str(rounds), str(channels)]
        self.proc = subprocess.Popen(cmd)
        self.group = create_group("127.0.0.1", port, 0, 2, backend="gloo", timeout_s=600, channels=channels)
        self.buffer = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
        self.ack = torch.zeros(1, dtype=torch.uint8)
        self.channels = channels

    def send(self) -> None:
        broadcast_all(self.group, [self.buffer], timeout_s=600, channels=self.channels)
        self.group.broadcast(self.ack, 1, TIMEOUT).wait()

    def close(self) -> None:
        self.proc.wait(timeout=60)


def raw_receiver(port: int, nbytes: int, rounds: int, channels: int) -> None:
    group = create_group("127.0.0.1", port, 1, 2, backend="gloo", timeout_s=600, channels=channels)
    buffer, ack = torch.empty(nbytes, dtype=torch.uint8), torch.ones(1, dtype=torch.uint8)
    for _ in range(rounds):
        broadcast_all(group, [buffer], timeout_s=600, channels=channels)
        group.broadcast(ack, 1, TIMEOUT).wait()


class RawSocket:
    """The same bytes over one plain TCP connection on loopback (``sendall`` / ``recv_into``, no gloo) to a
    helper subprocess that acknowledges each receipt with one byte: what the kernel's loopback gives."""

    def __init__(self, nbytes: int, rounds: int) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        port = self.server.getsockname()[1]
        cmd = [sys.executable, __file__, "--socket-receiver", str(port), str(nbytes), str(rounds)]
        self.proc = subprocess.Popen(cmd)
        self.conn, _ = self.server.accept()
        self.buffer = memoryview(torch.randint(0, 255, (nbytes,), dtype=torch.uint8).numpy())

    def send(self) -> None:
        self.conn.sendall(self.buffer)
        self.conn.recv(1)

    def close(self) -> None:
        self.proc.wait(timeout=60)
        self.conn.close()
        self.server.close()


def socket_receiver(port: int, nbytes: int, rounds: int) -> None:
    conn = socket.create_connection(("127.0.0.1", port))
    buffer = memoryview(torch.empty(nbytes, dtype=torch.uint8).numpy())
    for _ in range(rounds):
        got = 0
        while got < nbytes:
            got += conn.recv_into(buffer[got:])
        conn.sendall(b"k")
    conn.close()


def bench_size(label: str, repeats: int, channels: list[int], root: Path) -> None:
    model_dir = build_tiny_model(root / label, seed=0, **SIZES[label])
    state = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    params = sum(t.numel() for t in state.values())
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in once: the copy below is memory bandwidth, not first touch
    loops = max(1, (256 << 20) // nbytes)  # back-to-back copies of >= 256 MB in all
    times: dict[str, list[float]] = {}
    stages: dict[str, dict[str, list[float]]] = {v: {s: [] for s in STAGES} for v in ("serial", "shm")}
    raws = {k: RawBroadcast(nbytes, repeats + 1, k) for k in channels}
    tcp = RawSocket(nbytes, repeats + 1)
    for raw in (*raws.values(), tcp):
        raw.send()  # warm-up
    args = ["--transfer-timeout", "600"]
    with ExitStack() as stack:
        # one server per publisher: each sees one layout every time (as a training run's server does), so
        # its receive buffers alternate between two warm sets instead of faulting in fresh pages
        def publisher(**kwargs: object) -> BroadcastPolicyPublisher:
            url = stack.enter_context(running_server(model_dir, args))
            client = VLLMChatClient(base_url=url, enable_weight_updates=True, timeout_s=600)
            return BroadcastPolicyPublisher(client, timeout_s=600, **kwargs)  # type: ignore[arg-type]

        bcasts = {k: publisher(channels=k) for k in channels}
        serial = bcasts[channels[0]]  # the same server and group as its broadcast, overlap switched off
        flat = publisher(overlap=False, pack_below_bytes=1 << 62, bucket_bytes=1 << 62)  # one packed buffer
        shm = publisher(backend="shm")
        blob = ClientPublisher(flat.client, timeout_s=600)
        for warm in (0, 1):  # set-up (group join) and both receive-buffer sets faulted in, not timed
            for pub in (*bcasts.values(), flat, shm):
                pub.publish(state, version=warm)
        version = 2
        for _ in range(repeats):
            add(times, "copy", timed(lambda: dst.copy_(src)))
            add(times, "copy, 1 thread", timed(lambda: copy_on_one_thread(dst, src, loops)) / loops)
            for k, raw in raws.items():
                add(times, f"raw c{k}", timed(raw.send))
            add(times, "tcp socket", timed(tcp.send))
            for k, pub in bcasts.items():
                pub.overlap = True
                add(times, f"broadcast c{k}", timed(lambda v=version, p=pub: p.publish(state, version=v)))
            serial.overlap = False
            add(times, "serial", timed(lambda v=version: serial.publish(state, version=v + 1)))
            serial.overlap = True
            add(times, "shm", timed(lambda v=version: shm.publish(state, version=v)))
            for variant, pub in (("serial", serial), ("shm", shm)):
                for s in STAGES:
                    stages[variant][s].append(pub.last_stats.get(s, 0.0))
            add(times, "flat", timed(lambda v=version: flat.publish(state, version=v)))
            add(times, "raw_same", flat.last_stats["server_receive_s"])
            add(times, "blob", timed(lambda v=version: blob.publish(state, version=v + 1)))
            version += 2
        for pub in (*bcasts.values(), flat, shm):
            pub.close()
    for raw in (*raws.values(), tcp):
        raw.close()
    report(label, params, nbytes, times, stages)


def copy_on_one_thread(dst: torch.Tensor, src: torch.Tensor, loops: int) -> None:
    """``loops`` back-to-back copies on this thread alone: no OpenMP thread to wake (on a loaded machine a
    small copy's other thread can wait milliseconds for a core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(loops):
            dst.copy_(src)
    finally:
        torch.set_num_threads(threads)


def add(times: dict[str, list[float]], key: str, seconds: float) -> None:
    times.setdefault(key, []).append(seconds)


def report(
    label: str, params: int, nbytes: int, times: dict[str, list[float]], stages: dict[str, dict[str, list[float]]]
) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    limit = min(med["copy"], med["copy, 1 thread"])  # the faster way to copy these bytes: the stricter limit
    best = min(min(times["copy"]), min(times["copy, 1 thread"]))  # the copy least disturbed by other jobs
    print(f"{label:>5} ({params / 1e6:.1f}M params, {nbytes / 1e6:.0f} MB), GB/s of the median, then x the faster "
          f"median copy ({nbytes / limit / 1e9:.2f} GB/s) and x the fastest copy ({nbytes / best / 1e9:.2f} GB/s):")
    for k, t in med.items():
        print(f"      {k:<14} {nbytes / t / 1e9:6.2f} GB/s  {limit / t:.3f}x  {best / t:.3f}x")
    for variant, split in stages.items():
        parts = " | ".join(f"{s.removesuffix('_bytes')} {statistics.median(v) / 1e6:.0f} MB" if s.endswith("_bytes")
                           else f"{s.removesuffix('_s')} {1e3 * statistics.median(v):.1f} ms" for s, v in split.items())
        print(f"      {variant} publish {1e3 * med[variant]:.1f} ms = {parts}", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--raw-receiver":
        raw_receiver(*(int(a) for a in sys.argv[2:6]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--socket-receiver":
        socket_receiver(*(int(a) for a in sys.argv[2:5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--channels", type=int, nargs="+", default=[1, 2, 4],
                        help="gloo connections per broadcast to compare (the first also gives the serial stages)")
    args = parser.parse_args()
    print(f"median of {args.repeats} interleaved runs; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for label in args.sizes:
            bench_size(label, args.repeats, args.channels, Path(tmp))


if __name__ == "__main__":
    main()
