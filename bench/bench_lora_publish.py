"""Publishing a LoRA run's policy: the adapter alone vs merged weights, in time and bytes, and the RL step.

A ~100M-parameter Qwen2 (hidden 768, 14 layers, fp32) is served by a real ``python -m ludic.inference.server``
subprocess per transport; the trainer holds the same model wrapped by peft with rank-16 adapters (on the
attention projections q/k/v/o by default, ``--targets``). Per repeat, interleaved, for each transport
(``shm``: same-host shared memory; ``gloo``: the collective over loopback):
- "merged": ``merged_state_dict`` (W + B A on every adapted layer, the whole model) + ``publish`` end to end;
- "adapter fold" / "adapter unmerged": ``lora_payload`` (the lora_A / lora_B tensors + config) + ``publish`` end
  to end, to a server run with that ``--adapter-serving``: it checks the adapter and folds it into its weights
  (``W_base + scaling * B A``) or only stores A and B (served beside the base), under the same lock and versioning.
- "step merged" / "step adapter ...": one whole RL step of the LoRA run (``Trainer.train_step``: a batch of
  2 x 32 tokens, backward, AdamW over the adapters, publish) with that publisher over shm.
- "decode": the lean decoding step at 16 rows with the adapter served unmerged vs not (= folded, the same
  matmuls as the base), in process, interleaved (``--decode``).
Medians are reported. Goal (issue 28): adapter bytes <= 2% and time <= 0.1x of the merged publish.
Run: ``OMP_NUM_THREADS=2 .venv/bin/python bench/bench_lora_publish.py [--repeats 3 --targets q_proj k_proj v_proj o_proj
--adapter-serving fold unmerged]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from ludic.distributed import BroadcastPolicyPublisher, adapter_payload
from ludic.inference import TransformersChatClient, VLLMChatClient
from ludic.inference.embedded.adapters import ADAPTER_SERVING
from ludic.kernels.cpu.lean_decoder import StaticKVCache
from ludic.testing import build_tiny_model
from ludic.testing.server_process import start_server, stop_server
from ludic.training._lora import merged_state_dict
from ludic.training.algorithm import RLAlgorithm
from ludic.training.config import TrainerConfig
from ludic.training.loss import ReinforceLoss
from ludic.training.trainer import Trainer
from ludic.training.types import SAWBatch, SAWItem


class NoCredit:
    def compute(self, rollouts: list) -> dict:
        raise AssertionError("credit comes with the batch")


class FixedBatch:
    async def next_batch(self) -> SAWBatch:
        items = [SAWItem(list(range(5 + j, 37 + j)), [1] * 32, [0] * 8 + [1] * 24, 1.0 - j) for j in range(2)]
        return SAWBatch(items=items, meta={})


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


PARTS = ("publish_pack_s", "publish_wait_s", "publish_control_s", "server_check_wait_s", "server_load_s")


def timed_publish(publisher: BroadcastPolicyPublisher, model: torch.nn.Module, mode: str, version: int) -> dict:
    """Seconds: ``total`` (payload to the server's reply), ``payload`` (building it) and the publisher's stages."""
    t0 = time.perf_counter()
    payload = adapter_payload(model) if mode.startswith("adapter") else merged_state_dict(model)
    t1 = time.perf_counter()
    publisher.publish(payload, version=version)
    parts = {k: publisher.last_stats.get(k, 0.0) for k in PARTS}
    return {"total": time.perf_counter() - t0, "payload": t1 - t0, **parts}


def print_parts(parts: dict[str, list[dict]]) -> None:
    """Where each publish's time went (medians, ms); control includes the server's check wait and load
    (the finish call waits for them), the rest of control is the HTTP round trips."""
    for key, rows in parts.items():
        med = {k: statistics.median(r[k] for r in rows) * 1e3 for k in rows[0]}
        http = med["publish_control_s"] - med["server_check_wait_s"] - med["server_load_s"]
        print(f"  {key:22s} total {med['total']:7.1f} = payload {med['payload']:5.1f} + pack {med['publish_pack_s']:5.1f}"
              f" + wire wait {med['publish_wait_s']:5.1f} + HTTP round trips {http:5.1f} + server check wait "
              f"{med['server_check_wait_s']:5.1f} + server load/fold {med['server_load_s']:6.1f} ms")  # fmt: skip


def trainer_for(model: torch.nn.Module, publisher: BroadcastPolicyPublisher) -> Trainer:
    algo = RLAlgorithm(name="reinforce", credit_assigner=NoCredit(), loss=ReinforceLoss(old_logp_key=None))
    cfg = TrainerConfig(lr=1e-4, max_seq_len=64, micro_token_budget=64, sync_every_steps=1)
    return Trainer(model=model, algo=algo, batch_source=FixedBatch(), publisher=publisher, cfg=cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", nargs="+", default=["q_proj", "k_proj", "v_proj", "o_proj"])
    parser.add_argument("--transports", nargs="+", default=["shm", "gloo"])
    parser.add_argument("--steps", action=argparse.BooleanOptionalAction, default=True, help="also time RL steps")
    parser.add_argument("--adapter-serving", nargs="+", default=list(ADAPTER_SERVING), choices=ADAPTER_SERVING)
    parser.add_argument("--decode", action=argparse.BooleanOptionalAction, default=True,
                        help="also time a decoding step with the adapter unmerged vs folded")  # fmt: skip
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    model_dir = build_tiny_model(root / "m", hidden_size=768, num_layers=14, num_heads=12, num_kv_heads=12,
                                 intermediate_size=2048)  # fmt: skip
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, target_modules=args.targets)
    model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)
    full, adapter = nbytes(merged_state_dict(model)), nbytes(adapter_payload(model))
    print(f"model {full / 4e6:.1f}M params ({full / 1e6:.0f} MB); adapter rank {args.rank} on {args.targets}: "
          f"{adapter / 1e6:.2f} MB = {adapter / full:.2%} of the merged bytes")  # fmt: skip
    # a server per transport and mode: after a merged publish a server's base is the merged model, on which
    # the adapter (trained on the pristine base) is rightly refused
    modes = ["merged"] + [f"adapter {s}" for s in args.adapter_serving]
    keys = [(t, mode) for t in args.transports for mode in modes]
    servers = {k: start_server(model_dir, "--transfer-timeout", "60", "--adapter-serving", k[1].split()[-1]
                               if k[1] != "merged" else "fold") for k in keys}  # fmt: skip
    times: dict[str, list[float]] = {}
    parts: dict[str, list[dict]] = {}
    try:
        pubs = {k: BroadcastPolicyPublisher(VLLMChatClient(base_url=servers[k][1], enable_weight_updates=True),
                                            backend=k[0], timeout_s=120, lora=k[1].split()[0]) for k in keys}  # fmt: skip
        version = 0
        for rep in range(args.repeats + 1):  # the first round warms the buffers up and is not counted
            version += 1
            for (t, mode), pub in pubs.items():
                stages = timed_publish(pub, model, mode, version)
                if rep:
                    times.setdefault(f"{t} {mode}", []).append(stages["total"])
                    parts.setdefault(f"{t} {mode}", []).append(stages)
        if args.steps:
            for rep in range(args.repeats + 1):
                for mode in modes:
                    pub = pubs[(args.transports[0], mode)]
                    trainer = trainer_for(model, pub)
                    trainer.step = version = version + 1  # versions never go backwards on the server
                    t0 = time.perf_counter()
                    stats = trainer.train_step_sync()
                    if rep:
                        times.setdefault(f"step {mode}", []).append(time.perf_counter() - t0)
                        times.setdefault(f"step {mode} publish", []).append(stats["perf/publish_seconds"])
                    trainer.close()
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    med = {k: statistics.median(v) for k, v in times.items()}
    for t, mode in keys:
        m, a = med[f"{t} merged"], med[f"{t} {mode}"]
        if mode != "merged":
            print(f"{t:5s} publish: merged {m * 1e3:8.1f} ms, {mode} {a * 1e3:7.1f} ms -> {a / m:.3f}x the time")
    print_parts(parts)
    if args.steps:
        sm, pm = med["step merged"], med["step merged publish"]
        for mode in modes[1:]:
            sa, pa = med[f"step {mode}"], med[f"step {mode} publish"]
            print(f"RL step ({args.transports[0]}): merged {sm:.3f} s (publish {pm:.3f}), {mode} {sa:.3f} s (publish "
                  f"{pa:.3f}): saved {sm - sa:.3f} s a step, publish saved {pm - pa:.3f} s")  # fmt: skip
    if args.decode:
        decode_cost(model_dir, adapter_payload(model), repeats=args.repeats)
    print({k: [round(x, 4) for x in v] for k, v in times.items()})


def decode_cost(model_dir: Path, payload, repeats: int, rows: int = 16, steps: int = 20) -> None:
    """A lean decoding step of ``rows`` rows with the adapter served unmerged vs folded (the folded step runs the
    base's matmuls on other values: the same work as no adapter), interleaved in blocks of ``steps`` steps."""
    engine = TransformersChatClient(model_dir, adapter_serving="unmerged")
    model, lean = engine.model, engine._generator.lean
    width = 64
    with torch.inference_mode():
        cache = model(input_ids=torch.randint(3, 250, (rows, width)), use_cache=True).past_key_values
        static = StaticKVCache.from_prefill(cache, torch.arange(rows), torch.ones(rows, width), width + 4)
        cos, sin = lean.rope_tables(width + 4, torch.float32)
        plain = lean.bind(rows)
        engine.sync_adapter(payload)
        unmerged = lean.bind(rows)
        token, position = torch.randint(3, 250, (rows,)), torch.full((rows,), width)
        samples: dict[str, list[float]] = {"folded / none": [], "unmerged": []}
        for _ in range(3 * repeats + 1):
            for key, weights in (("folded / none", plain), ("unmerged", unmerged)):
                t0 = time.perf_counter()
                for _ in range(steps):
                    lean.step(weights, token, cos[position], sin[position], static, width)
                samples[key].append((time.perf_counter() - t0) / steps)
    f, u = (statistics.median(v[1:]) for v in samples.values())
    print(f"decode step ({rows} rows, lean): folded {f * 1e3:.2f} ms, unmerged {u * 1e3:.2f} ms -> {u - f:+.5f} s "
          f"a step ({u / f - 1:+.1%}); interleaved, medians of {len(samples['unmerged']) - 1} blocks of {steps}")  # fmt: skip


if __name__ == "__main__":
    main()
