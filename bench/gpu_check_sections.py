"""The sections of ``gpu_check.py``: each measures one thing and returns a JSON-able dict.

Every section takes (``Sizes``, deadline) and stops early rather than pass its deadline: what it has
measured by then is returned (``partial: true``). ``Sizes.full()`` is the one-H100 run, ``Sizes.dry()``
the same code at sizes a CPU runs in seconds (the default test suite runs it).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
BF16_DENSE_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
"""Dense bf16 tensor-core peak FLOP/s (NVIDIA datasheets: H100 SXM and H200 989.4 TFLOP/s without
sparsity; A100 312). A GPU not listed reports no MFU."""


@dataclass(frozen=True)
class Sizes:
    device: str
    dtype: str
    body: dict[str, int]  # Qwen2 shape without the vocabulary
    vocab: int
    groups: int
    group_size: int
    prompt_len: int
    reply_len: int  # replies are U(reply_len / 4, reply_len) tokens
    micro_token_budget: int
    timed_steps: int
    engine_rows: int
    engine_new_tokens: int
    quickstart: dict[str, Any]

    @staticmethod
    def full() -> Sizes:
        qwen2_05b = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864)  # fmt: skip
        return Sizes("cuda", "bfloat16", qwen2_05b, 151936, 8, 8, 256, 512, 16384, 3, 32, 128,
                     dict(steps=50, sft_steps=30, eval_episodes=64, eval_every=0, device="cuda"))  # fmt: skip

    @staticmethod
    def dry() -> Sizes:
        tiny = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=128)  # fmt: skip
        return Sizes("cpu", "float32", tiny, 259, 2, 3, 12, 16, 512, 1, 4, 8,
                     dict(steps=2, sft_steps=1, eval_episodes=4, eval_every=0, group_size=4, prompts_per_step=2,
                          max_new_tokens=8, device="cpu"))  # fmt: skip


def _dtype(sizes: Sizes) -> torch.dtype:
    return getattr(torch, sizes.dtype)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build_model(sizes: Sizes, vocab: int, seed: int = 0) -> torch.nn.Module:
    """A Qwen2-shaped model with random weights, built on the device in its dtype (nothing downloaded)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=4096,
                         attn_implementation="sdpa", **sizes.body)  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(sizes.device):
        return AutoModelForCausalLM.from_config(config, dtype=_dtype(sizes))


def machine(sizes: Sizes, deadline: float) -> dict[str, Any]:
    """The GPU, driver, torch and CUDA, and the wheels carried for this run."""
    out: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}", "gpus": torch.cuda.device_count()}  # fmt: skip
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)  # fmt: skip
        out["driver"] = smi.stdout.strip() or smi.stderr.strip()[-200:]
    else:
        out["gpu"] = None
    import transformers

    out["transformers"] = transformers.__version__
    carried = os.environ.get("LUDIC_GPU_CARRIED", "")
    out["carried"] = [c for c in carried.split(",") if c]
    out["bf16_dense_peak_tflops"] = _peak(out.get("gpu")) / 1e12 if _peak(out.get("gpu")) else None
    try:
        from torch.nn.attention import flex_attention  # noqa: F401

        out["flex_attention"] = True
    except ImportError:
        out["flex_attention"] = False
    return out


def _peak(gpu: str | None) -> float | None:
    return next((peak for name, peak in BF16_DENSE_PEAK.items() if gpu and name in gpu), None)


def grpo_items(sizes: Sizes, vocab: int, seed: int = 0) -> list:
    """GRPO-shaped items: ``groups`` prompts, ``group_size`` replies each of U(reply_len / 4, reply_len)."""
    from ludic.training.batching.saw_builder import prompt_completion_item

    rng = random.Random(seed)
    items = []
    for _ in range(sizes.groups):
        prompt = [rng.randrange(3, vocab) for _ in range(sizes.prompt_len)]
        for _ in range(sizes.group_size):
            reply = [rng.randrange(3, vocab) for _ in range(rng.randint(max(1, sizes.reply_len // 4), sizes.reply_len))]
            items.append(prompt_completion_item(prompt, reply, weight=rng.uniform(-1, 1), actor_logps=[-1.0] * len(reply)))
    return items


def model_flops(model: torch.nn.Module, items: list) -> float:
    """Training FLOPs of ``items`` as plain sequences: 6 N T for the matmuls (N: parameters outside the
    embedding, plus the output layer's) and 6 h T^2 / 2 per layer for causal attention (forward + backward;
    the recomputation of activation checkpointing is not counted, as MFU does not)."""
    cfg = model.config
    n = sum(p.numel() for p in model.parameters())  # tied: the embedding counted once, as the output layer
    n -= 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size  # the lookup costs no matmul
    lengths = [len(it.input_ids) for it in items]
    return sum(6 * n * t + 3 * cfg.num_hidden_layers * cfg.hidden_size * t * t for t in lengths)


def train_step(model, optimizer, loss_fn, items, *, mode: str, sizes: Sizes) -> dict[str, float]:
    """One optimizer step through Ludic's micro-batch path (as the Trainer runs it) in one layout."""
    from ludic.training.layout.forward import micro_batch_kernels, micro_batch_loss, plan_micro_batches

    pack, blocks = mode != "padded", mode in ("packed", "packed_default")
    ratio = 0.5 if mode == "packed_default" else None
    mbs = plan_micro_batches(model, items, micro_token_budget=sizes.micro_token_budget, max_seq_len=sizes.prompt_len + sizes.reply_len, pack=pack,
                             block_attention=blocks, cuda_packed_max_ratio=ratio)  # fmt: skip
    device = torch.device(sizes.device)
    optimizer.zero_grad(set_to_none=True)
    _sync(sizes.device)
    t0 = time.perf_counter()
    total, positions = 0.0, 0
    for mb in mbs:
        with micro_batch_kernels(model, mb):
            loss, _, computed = micro_batch_loss(model, loss_fn, mb, pad_token_id=0, device=device)
            (loss * len(mb.items) / len(items)).backward()
        total += float(loss.detach()) * len(mb.items) / len(items)
        positions += computed
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    _sync(sizes.device)
    return {"seconds": time.perf_counter() - t0, "loss": total, "positions": positions,
            "packed": any(mb.plan is not None for mb in mbs), "block_attention": any(mb.block_attention for mb in mbs),
            "micro_batches": len(mbs)}  # fmt: skip


def train(sizes: Sizes, deadline: float) -> dict[str, Any]:
    """Training steps at ~0.5B (bf16, activation checkpointing): padded vs packed with prompt sharing."""
    from ludic.training._setup import enable_gradient_checkpointing
    from ludic.training.presets import make_grpo

    model = build_model(sizes, sizes.vocab)
    enable_gradient_checkpointing(model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    loss_fn = make_grpo(group_size=sizes.group_size).loss
    items = grpo_items(sizes, sizes.vocab)
    flops = model_flops(model, items)
    tokens = sum(len(it.input_ids) for it in items)
    peak = _peak(torch.cuda.get_device_name(0) if sizes.device == "cuda" else None)
    out: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters()), "tokens_per_step": tokens,
                           "model_tflop_per_step": flops / 1e12, "modes": {}}  # fmt: skip
    for mode in ("padded", "packed", "packed_default", "packed_dense"):
        if time.monotonic() > deadline:
            out["partial"] = True
            break
        if sizes.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        warm = train_step(model, optimizer, loss_fn, items, mode=mode, sizes=sizes)  # compiles flex on CUDA
        steps = []
        for _ in range(sizes.timed_steps):
            if time.monotonic() > deadline:
                break
            steps.append(train_step(model, optimizer, loss_fn, items, mode=mode, sizes=sizes))
        best = min((s["seconds"] for s in steps), default=warm["seconds"])
        out["modes"][mode] = {**{k: warm[k] for k in ("packed", "block_attention", "micro_batches", "positions")},
                              "warmup_seconds": warm["seconds"], "seconds": best, "tokens_per_s": tokens / best,
                              "mfu": flops / best / peak if peak else None, "loss": warm["loss"],
                              "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if sizes.device == "cuda" else None}  # fmt: skip
    return out


def engine(sizes: Sizes, deadline: float) -> dict[str, Any]:
    """The embedded engine (32 concurrent requests) against one batched ``model.generate``, same model."""
    from transformers import AutoTokenizer

    from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
    from ludic.testing import tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))  # byte-level: any vocabulary id decodes
    model = build_model(sizes, len(tokenizer))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    client = TransformersChatClient(model, tokenizer, device=sizes.device, max_batch_size=sizes.engine_rows,
                                    generate_in_thread=True)  # as on CUDA, also in the dry run  # fmt: skip
    reqs = [ChatCompletionRequest(model="m", messages=[{"role": "user", "content": f"Repeat the letter {chr(97 + i % 4)}."}],
                                  sampling=SamplingConfig(temperature=1.0, max_tokens=sizes.engine_new_tokens, seed=i))
            for i in range(sizes.engine_rows)]  # fmt: skip

    async def run_engine() -> int:
        results = await asyncio.gather(*[client.complete(r) for r in reqs])
        return sum(len(r.completion_token_ids) for r, _ in results)

    @torch.inference_mode()
    def run_generate() -> int:
        prompts = [client.prompt_ids_for(r) for r in reqs]
        width, pad = max(map(len, prompts)), tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=sizes.device)
        gen = model.generate(input_ids=ids, attention_mask=(ids != pad).long(), do_sample=True, temperature=1.0,
                             top_p=1.0, top_k=0, max_new_tokens=sizes.engine_new_tokens, pad_token_id=pad)  # fmt: skip
        new = gen[:, width:]
        eos = torch.tensor(sorted(client._eos_ids()), device=new.device)
        done = torch.isin(new, eos).int().cumsum(1)
        return int(((done == 0) | ((done == 1) & torch.isin(new, eos))).sum())  # up to and including EOS

    out: dict[str, Any] = {"rows": sizes.engine_rows, "new_tokens": sizes.engine_new_tokens,
                           "params": sum(p.numel() for p in model.parameters()), "rounds": []}  # fmt: skip

    async def rounds() -> None:  # one event loop for the client's worker, as in a training run
        for _ in range(3):  # round 0 warms both up
            if time.monotonic() > deadline:
                out["partial"] = True
                return
            row = {}
            for name in ("engine", "generate"):
                _sync(sizes.device)
                t0 = time.perf_counter()
                n = await run_engine() if name == "engine" else run_generate()
                _sync(sizes.device)
                row[name] = {"tokens": n, "tokens_per_s": n / (time.perf_counter() - t0)}
            out["rounds"].append(row)

    asyncio.run(rounds())
    timed = out["rounds"][1:] or out["rounds"]
    if timed:
        ratios = sorted(r["engine"]["tokens_per_s"] / r["generate"]["tokens_per_s"] for r in timed)
        out["engine_over_generate"] = ratios[len(ratios) // 2]
    return out


def quickstart(sizes: Sizes, deadline: float, out_dir: Path) -> dict[str, Any]:
    """``ludic quickstart`` on the device, short: reward before and after RL, seconds per step."""
    run_dir = out_dir / "quickstart"
    args = [f"--{k.replace('_', '-')}={v}" for k, v in sizes.quickstart.items()]
    cmd = [sys.executable, "-m", "ludic.cli", "quickstart", *args, "--no-live", f"--output-dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()), env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"quickstart exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    keep = ("eval_initial", "eval_before_rl", "eval_after", "rl_gain", "rl_seconds_per_step", "train_seconds")
    return {"command": " ".join(cmd[1:]), **{k: summary[k] for k in keep}}


def determinism(sizes: Sizes, deadline: float) -> dict[str, Any]:
    """The same seed twice gives the same losses, and they are finite (two steps, packed layout)."""
    from ludic.training.presets import make_grpo

    small = Sizes(**{**asdict(sizes), "body": {**sizes.body, "num_hidden_layers": 2}})
    out: dict[str, Any] = {}
    for mode in ("padded", "packed"):
        if time.monotonic() > deadline:
            out["partial"] = True
            break
        runs = []
        for _ in range(2):
            model = build_model(small, 512, seed=123)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            loss_fn = make_grpo(group_size=small.group_size).loss
            items = grpo_items(small, 512, seed=7)
            runs.append([train_step(model, optimizer, loss_fn, items, mode=mode, sizes=small)["loss"] for _ in range(2)])
        out[mode] = {"losses": runs, "finite": all(math.isfinite(x) for run in runs for x in run),
                     "equal": runs[0] == runs[1], "max_abs_diff": max(abs(a - b) for a, b in zip(*runs, strict=True))}  # fmt: skip
    return out
