"""Training's RMSNorm and gated-MLP elementwise parts through Ludic's kernels vs PyTorch's ops, interleaved.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_recompute_kernels.py [MODEL_DIR] [--rounds 20 --layer-rounds 40]

Two parts, each variant alternating with the other (these machines drift by 10% within minutes):
- per layer, SmolLM2-135M's shapes (hidden 576, intermediate 1,536) at 630 rows of a micro-batch, caches
  flushed before each call as in a step: ``RMSNormKeepInput`` and ``GatedMLPDown`` forward + backward with
  the kernels (``kernels/cpu/rms_norm.py``, ``swiglu.py``) and with PyTorch's ops; medians in ms;
- a whole forward-backward of a GRPO-shaped batch (4 prompts of 55 tokens x 8 replies of 30-63 tokens,
  random ids) on the model in MODEL_DIR (default: the catalogue's SmolLM2-135M-Instruct, ``ludic models pull
  smollm2-135m-instruct``), the Trainer's micro-batches and kernels, the two kernels on vs off, rounds in
  alternating order; the median of each and of the rounds' paired ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from pathlib import Path

import torch

from ludic.kernels.cpu import rms_norm, swiglu
from ludic.kernels.cpu.recompute import GatedMLPDown, RMSNormKeepInput

ROWS, HIDDEN, INTERMEDIATE = 630, 576, 1536


def _flush(buffer: torch.Tensor) -> None:
    buffer.fill_(1.0)  # 64 MB written: the layer's inputs come from memory, as after a step's other layers


def layer_part(rounds: int) -> dict[str, dict[str, float]]:
    flush = torch.empty(16 * 1024 * 1024)
    norm_w = torch.rand(HIDDEN, requires_grad=True)
    down_w = torch.randn(HIDDEN, INTERMEDIATE, requires_grad=True)
    upstream = torch.randn(ROWS, HIDDEN)  # a dense gradient from the layer above, as in a step

    def norm(native: bool) -> float:
        x = torch.randn(ROWS, HIDDEN, requires_grad=True)
        _flush(flush)
        t = time.perf_counter()
        RMSNormKeepInput.apply(x, norm_w, 1e-5, native).backward(upstream)
        return time.perf_counter() - t

    def mlp(native: bool) -> float:
        g, u = (torch.randn(ROWS, INTERMEDIATE, requires_grad=True) for _ in range(2))
        _flush(flush)
        t = time.perf_counter()
        GatedMLPDown.apply(g, u, down_w, None, True, native).backward(upstream)
        return time.perf_counter() - t

    out = {}
    for name, fn in (("RMSNorm", norm), ("gated MLP (with its down projection)", mlp)):
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(rounds + 3):
            for native in (False, True) if r % 2 == 0 else (True, False):
                dt = fn(native)
                if r >= 3:  # warm-up rounds dropped
                    times[native].append(dt)
        plain, fused = (statistics.median(times[k]) * 1000 for k in (False, True))
        out[name] = {"pytorch_ms": plain, "kernel_ms": fused, "speedup": plain / fused}
    return out


def step_part(model_dir: str, rounds: int) -> dict[str, object]:
    from transformers import AutoModelForCausalLM

    import ludic.training.layout.forward as forward
    from ludic.training.batching import prompt_completion_item
    from ludic.training.presets import make_grpo

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rng = random.Random(0)
    items = []
    for _ in range(4):
        prompt = [rng.randrange(100, 40000) for _ in range(55)]
        for _ in range(8):
            reply = [rng.randrange(100, 40000) for _ in range(rng.randrange(30, 64))]
            logps = [rng.uniform(-4, -0.5) for _ in reply]
            items.append(prompt_completion_item(prompt, reply, weight=rng.uniform(-1, 1), actor_logps=logps))
    loss_fn, real_select = make_grpo(group_size=8).loss, forward.select

    def step(native: bool) -> float:
        forward.select = lambda *a, **k: dataclasses.replace(real_select(*a, **k), swiglu=native, rms_norm=native)
        try:
            mbs = forward.plan_micro_batches(model, items, micro_token_budget=8192, max_seq_len=256, keep_head_logits=True)
            model.zero_grad(set_to_none=True)
            t = time.perf_counter()
            for mb in mbs:
                with forward.micro_batch_kernels(model, mb):
                    loss, _, _ = forward.micro_batch_loss(model, loss_fn, mb, pad_token_id=0, device=torch.device("cpu"))
                    loss.backward()
            return time.perf_counter() - t
        finally:
            forward.select = real_select

    step(False), step(True)
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(rounds):
        for native in (False, True) if r % 2 == 0 else (True, False):
            times[native].append(step(native))
    ratios = [a / b for a, b in zip(times[False], times[True], strict=True)]
    return {"pytorch_s": statistics.median(times[False]), "kernels_s": statistics.median(times[True]),
            "speedup_of_medians": statistics.median(times[False]) / statistics.median(times[True]),
            "median_paired_ratio": statistics.median(ratios), "ratios": [round(x, 3) for x in ratios]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=None, help="transformers folder (default: the catalogue's)")
    parser.add_argument("--rounds", type=int, default=20, help="forward-backward pairs (0: the per-layer part only)")
    parser.add_argument("--layer-rounds", type=int, default=40, help="per-layer pairs")
    args = parser.parse_args()
    if not (swiglu.available() and rms_norm.available()):
        raise SystemExit(f"the kernels cannot run here: {swiglu.unavailable_reason() or rms_norm.unavailable_reason()}")
    print(f"threads {torch.get_num_threads()}; rows {ROWS}, hidden {HIDDEN}, intermediate {INTERMEDIATE}")
    for name, row in layer_part(args.layer_rounds).items():
        print(f"{name}: PyTorch {row['pytorch_ms']:.3f} ms, kernel {row['kernel_ms']:.3f} ms: {row['speedup']:.2f}x")
    if args.rounds <= 0:
        return
    if args.model is None:
        from ludic.models import prepared_path

        args.model = str(prepared_path("smollm2-135m-instruct"))
    if not Path(args.model).is_dir():
        raise SystemExit(f"model folder {args.model} not found: run `ludic models pull smollm2-135m-instruct` or pass one")
    result = step_part(args.model, args.rounds)
    print(f"forward-backward ({args.rounds} pairs): PyTorch's ops {result['pytorch_s']:.2f} s, kernels "
          f"{result['kernels_s']:.2f} s: {result['speedup_of_medians']:.3f}x (median of paired ratios "
          f"{result['median_paired_ratio']:.3f}x; pairs {result['ratios']})")  # fmt: skip


if __name__ == "__main__":
    main()
