"""Ludic on a real pretrained chat model (SmolLM2-135M-Instruct), side by side with TRL, on this CPU.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_real_model.py [MODEL_DIR] [--rounds 3 --steps 3]
    .venv/bin/python bench/bench_real_model.py MODEL_DIR --steps 1 --quick     # the smallest form

MODEL_DIR defaults to the catalogue's prepared folder (``ludic models pull smollm2-135m-instruct``). Task:
reasoning-gym ``basic_arithmetic`` (2 terms of 1 digit), GRPO, 4 prompts x 8 samples, 64 new tokens,
lr 1e-5, fp32, the model's chat template, no vLLM. Each run is its own process (peak RSS per side);
rounds interleave Ludic and TRL. Prints medians and ratios of:

(a) a Ludic GRPO step (``ludic train``'s run: embedded engine, Trainer, ``keep_head_logits = true``: the output
    layer keeps its logits for the backward; ``--recompute-head-logits`` for the default) vs TRL 1.16's
    ``GRPOTrainer``, with Ludic's ``time/`` split of its step;
(b) Ludic's step against its floor: training 6 x params x distinct trained tokens (``perf/distinct_tokens``:
    each shared prompt once, no padding) + generation 2 x params x generated tokens, at this CPU's fp32 matmul rate
    measured in the same process around each step (the mean of the rates just before and just after it: a
    machine whose speed drifts moves the floor with the step), step by step, median of the steps' ratios; and
    again with generation at the rate of a decoding step's own matmuls (every weight times one row per sequence,
    32 rows, measured in the same run);
(c) the embedded engine's batched decoding vs one batched ``model.generate``, 32 rows x 64 tokens;
(d) under contention: the bench starts one busy process per core and runs both sides again; slowdown =
    contended / quiet median step, side by side;
(e) memory: Ludic's peak RSS against issue 35's bound for full fine-tuning in fp32, (weights + gradients +
    Adam's two moments + the engine's copy of the weights) + 1 GiB = 5 x 4 bytes x params + 1 GiB;
(f) with ``--reward-steps N``: each side trains N steps, then Ludic's evaluator scores the untrained model and
    both trained ones, greedy, on every held-out question of the run's env (the issue's "at equal reward").
The first step of each run (warm-up) is left out when a run has more than one.
Needs the bench extra (trl, datasets) and reasoning-gym: ``pip install -e '.[bench,reasoning-gym]'``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TASK = {"dataset": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}
FULL = {"prompts": 4, "group": 8, "tokens": 64, "gen_rows": 32, "gen_tokens": 64}
QUICK = {"prompts": 2, "group": 2, "tokens": 8, "gen_rows": 4, "gen_tokens": 8}
LR = 1e-5


def default_model() -> str:
    from ludic.models import prepared_path

    return str(prepared_path("smollm2-135m-instruct"))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
    """This CPU's fp32 matmul rate with this process's threads: median of ``repeats`` n x n products."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def decode_matmul_gflops(model: Any, rows: int, repeats: int = 5) -> float:
    """The rate of one decoding step's matmuls at ``rows`` rows: the embedded engine's own weights for a
    batch (``LeanDecoder.bind``: q/k/v and gate/up fused, oneDNN's packed layout) through its own matmul,
    every layer once in order and then the output layer, so each weight is read from memory as in a real
    step (the 538 MB of weights do not stay in cache)."""
    import torch

    from ludic.kernels.cpu.lean_decoder import LeanDecoder

    decoder = LeanDecoder(model)
    _, layers, (_, _, head_w, head_b), _ = decoder.bind(rows)
    projs = [p for w in layers for p in (*w.qkv, w.o_proj, *w.gate_up, w.down)] + [(head_w, head_b)]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w, _ in projs}
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            for w, b in projs:
                decoder.linear(inputs[w.shape[1]], w, b)
            times.append(time.perf_counter() - t0)
    return 2 * rows * sum(w.numel() for w, _ in projs) / statistics.median(times[1:]) / 1e9


def memory_bound_mb(params: int, bytes_per_param: int = 4) -> float:
    """Full fine-tuning's peak RSS bound: weights, gradients, two Adam moments, one engine copy, + 1 GiB."""
    return 5 * bytes_per_param * params / 2**20 + 1024


def kept(values: list[float]) -> list[float]:
    return values[1:] if len(values) > 1 else values


# ---- workers (one process each) --------------------------------------------------------------------
def ludic_config(
    model: str, steps: int, knobs: dict[str, int], out: Path, seed: int = 0, keep_head_logits: bool = True
) -> dict[str, Any]:
    """The run both ``ludic_worker`` trains and ``eval_worker`` evaluates (the same env and held-out split).

    ``keep_head_logits``: ``TrainerConfig.keep_head_logits`` (the bench's default: the output layer keeps its
    logits for the backward, ~70 MiB more at the peak; ``--recompute-head-logits`` runs the library default)."""
    return {
        "steps": steps, "seed": seed, "model": {"path": model},
        "env": {"name": "reasoning_gym", "kwargs": {**TASK, "size": 1000, "eval_size": 100, "seed": 0}},
        "harness": {"name": "plain"}, "algorithm": {"name": "grpo"},
        "rollout": {"prompts_per_step": knobs["prompts"], "group_size": knobs["group"], "concurrency": 64,
                    "sampling": {"temperature": 1.0, "max_tokens": knobs["tokens"]}},
        "eval": {"every_n_steps": 0},
        "trainer": {"lr": LR, "max_seq_len": 512, "keep_head_logits": keep_head_logits},
        "logging": {"output_dir": str(out), "rich": False, "plot": False},
    }  # fmt: skip


def save_final(model: Any, source: str, out: Path) -> None:
    """The trained weights and the source's tokenizer, as a folder ``eval_worker`` loads."""
    from transformers import AutoTokenizer

    model.save_pretrained(out / "final")
    AutoTokenizer.from_pretrained(source).save_pretrained(out / "final")


def ludic_worker(
    model: str, steps: int, knobs: dict[str, int], out: Path, save: bool = False, seed: int = 0,
    keep_head_logits: bool = True,
) -> dict[str, Any]:
    from ludic.cli.run_config import build_train_run
    from ludic.quickstart.run_config import to_run_config

    run = build_train_run(to_run_config(ludic_config(model, steps, knobs, out, seed, keep_head_logits)))
    stats, rates = asyncio.run(_steps(run, steps))  # one event loop for the run (the engine's tasks live on it)
    if save:
        save_final(run.trainer.model, model, out)
    params = sum(p.numel() for p in run.trainer.model.parameters())
    rows, rates = kept(stats), kept(rates)
    return {
        "step_seconds": [s["time/step_seconds"] for s in rows],
        "step_gflops": rates,
        "step_floor_s": [
            step_floor_s(params, s["perf/distinct_tokens"], generated_tokens(s), rate) for s, rate in zip(rows, rates, strict=True)
        ],
        "split": {k: statistics.median(s.get(k, 0.0) for s in rows) for k in rows[0] if k.startswith("time/")},
        "trained_tokens": statistics.median(s["perf/distinct_tokens"] for s in rows),
        "generated_tokens": statistics.median(generated_tokens(s) for s in rows),
        "params": params,
        "rss_mb": rss_mb(),
    }


async def _steps(run: Any, steps: int) -> tuple[list[dict[str, float]], list[float]]:
    """Each step's metrics, and this CPU's matmul rate around each step: the mean of the rates measured
    just before and just after it (outside the step's own time)."""
    stats, rates, before = [], [], matmul_gflops()
    for _ in range(steps):
        stats.append(await run.trainer.train_step())
        after = matmul_gflops()
        rates.append((before + after) / 2)
        before = after
    return stats, rates


def generated_tokens(step: dict[str, float]) -> float:
    return step["train/avg_completion_length"] * step["train/num_samples"]


def step_floor_s(params: int, trained: float, generated: float, gflops: float) -> float:
    """A step's matmul floor: training 6 x params x distinct trained tokens + generation 2 x params x
    generated tokens, at ``gflops``."""
    return (6 * params * trained + 2 * params * generated) / (gflops * 1e9)


def trl_worker(
    model: str, steps: int, knobs: dict[str, int], out: Path, save: bool = False, seed: int = 0
) -> dict[str, Any]:
    import reasoning_gym
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    data = reasoning_gym.create_dataset(TASK["dataset"], size=1000, seed=0, **TASK["config"])
    n = steps * knobs["prompts"]
    rows = [data[i] for i in range(n)]
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": r["question"]}] for r in rows],
                                 "index": list(range(n))})  # fmt: skip

    def reward(completions: list, index: list, **_: Any) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [float(data.score_answer(t, rows[i])) for t, i in zip(texts, index)]

    times: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            times.append(time.perf_counter() - self.t0)

    args = GRPOConfig(
        output_dir=str(out / "trl"), use_cpu=True, report_to="none", max_steps=steps, seed=seed, learning_rate=LR,
        lr_scheduler_type="constant", beta=0.0, weight_decay=0.0, num_generations=knobs["group"],
        per_device_train_batch_size=knobs["group"] * knobs["prompts"], max_completion_length=knobs["tokens"],
        temperature=1.0, logging_steps=1, save_strategy="no", shuffle_dataset=False, max_grad_norm=1.0,
        bf16=False, dataloader_num_workers=0, loss_type="dr_grpo", epsilon=0.2, epsilon_high=0.27,
        scale_rewards="group", gradient_checkpointing=False,
    )  # fmt: skip
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model), reward_funcs=reward, args=args,
                          train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(model),
                          callbacks=[StepTimes()])  # fmt: skip
    trainer.train()
    if save:
        save_final(trainer.model, model, out)
    return {"step_seconds": kept(times), "rss_mb": rss_mb()}


def eval_worker(model: str, knobs: dict[str, int], folders: list[str], out: Path) -> dict[str, Any]:
    """Held-out greedy reward of each model folder: Ludic's evaluator on the training run's env, every
    held-out question once (reasoning-gym's own ``score_answer``), the same for every folder."""
    from ludic.cli.run_config import eval_from_config
    from ludic.envs.reasoning_gym_env import reasoning_gym_rows
    from ludic.quickstart.run_config import to_run_config

    env = ludic_config(model, 0, knobs, out)["env"]["kwargs"]  # the training runs' split, rebuilt
    _, _, held = reasoning_gym_rows(env["dataset"], config=env["config"], size=env["size"], eval_size=env["eval_size"],
                                    seed=env["seed"])
    held_out = len(held)
    rewards = {}
    for folder in folders:
        data = ludic_config(folder, 0, knobs, out / Path(folder).parent.name)
        data["eval"] = {"num_episodes": held_out, "concurrency": held_out, "sampling": {"max_tokens": knobs["tokens"]}}
        rewards[folder] = eval_from_config(to_run_config(data))["eval/avg_total_reward"]
    return {"held_out_reward": rewards, "held_out_questions": held_out}


def engine_worker(model: str, knobs: dict[str, int], rounds: int) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_engine_speed import _engine, _hf_generate, _requests

    from ludic.inference import TransformersChatClient

    client = TransformersChatClient(model, generate_in_thread=False)
    rows, tokens = knobs["gen_rows"], knobs["gen_tokens"]
    asyncio.run(_engine(client, _requests(rows, 4, 0)))
    ratios, engine, generate = [], [], []
    for r in range(rounds):  # interleaved; each side's tokens/s (up to each row's EOS)
        t0 = time.perf_counter()
        n = asyncio.run(_engine(client, _requests(rows, tokens, r + 1)))
        engine.append(n / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        n = _hf_generate(client, _requests(rows, tokens, r + 1), tokens)
        generate.append(n / (time.perf_counter() - t0))
        ratios.append(engine[-1] / generate[-1])
    return {"engine_tok_s": statistics.median(engine), "generate_tok_s": statistics.median(generate),
            "ratio": statistics.median(ratios), "ratios": ratios, "gflops": matmul_gflops(),
            "decode_gflops": decode_matmul_gflops(client.model, rows)}  # fmt: skip


# ---- the driver ------------------------------------------------------------------------------------
def run_worker(kind: str, args: argparse.Namespace, tag: str, extra: list[str] | None = None) -> dict[str, Any]:
    out = Path(args.out) / tag
    cmd = [sys.executable, __file__, args.model, "--worker", kind, "--steps", str(args.steps), "--out", str(out),
           "--rounds", str(args.rounds), "--seed", str(args.seed)] + (["--quick"] if args.quick else []) + (
           ["--recompute-head-logits"] if args.recompute_head_logits else []) + (extra or [])  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode != 0:
        raise RuntimeError(f"{kind} worker failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def busy_processes() -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(len(os.sched_getaffinity(0)))]


def sides(args: argparse.Namespace) -> list[str]:
    return ["ludic"] + ([] if args.skip_trl else ["trl"])


def drive(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"quiet": {s: [] for s in sides(args)}, "busy": {s: [] for s in sides(args)}}
    for r in range(args.rounds):  # interleaved: ludic, trl, ludic, trl, ...
        for side in sides(args):
            results["quiet"][side].append(run_worker(side, args, f"quiet_{side}_{r}"))
    results["engine"] = run_worker("engine", args, "engine")
    if not args.skip_contention:
        busy = busy_processes()
        try:
            for side in sides(args):
                results["busy"][side].append(run_worker(side, args, f"busy_{side}"))
        finally:
            for p in busy:
                p.kill()
                p.wait()
    return results


def drive_reward(args: argparse.Namespace) -> dict[str, Any]:
    """Each side trains ``--reward-steps`` steps (one run each), then one process evaluates the
    untrained model and both trained ones on the same held-out questions."""
    steps = ["--steps", str(args.reward_steps), "--save"]
    folders = [args.model]
    for side in sides(args):
        run_worker(side, args, f"reward_{side}", steps)
        folders.append(str(Path(args.out) / f"reward_{side}" / "final"))
    result = run_worker("eval", args, "reward_eval", ["--folders", *folders])
    names = ["before", *sides(args)]
    rewards = dict(zip(names, (result["held_out_reward"][f] for f in folders), strict=True))
    return {"steps": args.reward_steps, "held_out_questions": result["held_out_questions"], **rewards}


def median_step(runs: list[dict[str, Any]]) -> float:
    return statistics.median(t for run in runs for t in run["step_seconds"])


def report(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    quiet, busy, eng = results["quiet"], results["busy"], results["engine"]
    ludic = quiet["ludic"]
    summary: dict[str, Any] = {"ludic_step_s": median_step(ludic), "ludic_peak_rss_mb": max(r["rss_mb"] for r in ludic),
                               "ludic_keep_head_logits": not args.recompute_head_logits}  # fmt: skip
    summary["ludic_time_split_s"] = {k: statistics.median(r["split"][k] for r in ludic) for k in ludic[0]["split"]}
    if "trl" in quiet:
        summary["trl_step_s"] = median_step(quiet["trl"])
        summary["trl_peak_rss_mb"] = max(r["rss_mb"] for r in quiet["trl"])
        summary["speedup_vs_trl"] = summary["trl_step_s"] / summary["ludic_step_s"]
    # the floor step by step, at the matmul rate measured in the same process around that step
    per_step = [t / f for r in ludic for t, f in zip(r["step_seconds"], r["step_floor_s"], strict=True)]
    summary["step_over_floor"] = statistics.median(per_step)
    summary["step_over_floor_per_step"] = per_step
    summary["matmul_gflops"] = statistics.median(g for r in ludic for g in r["step_gflops"])
    summary["engine_worker_matmul_gflops"] = eng["gflops"]
    rate = summary["matmul_gflops"] * 1e9
    params = ludic[0]["params"]
    trained = statistics.median(r["trained_tokens"] for r in ludic)
    generated = statistics.median(r["generated_tokens"] for r in ludic)
    floor_train, floor_gen = 6 * params * trained / rate, 2 * params * generated / rate
    summary["floor_s"] = {"train": floor_train, "generate": floor_gen, "total": floor_train + floor_gen}
    # the obstacle: decoding multiplies each weight by one row per live sequence, far below the square
    # products the rate above is measured on; the floor again with generation at that batch's own rate
    summary["decode_matmul_gflops"] = eng["decode_gflops"]
    floor_gen_decode = 2 * params * generated / (eng["decode_gflops"] * 1e9)
    summary["floor_at_decode_rate_s"] = {"train": floor_train, "generate": floor_gen_decode,
                                         "total": floor_train + floor_gen_decode}  # fmt: skip
    summary["step_over_floor_at_decode_rate"] = summary["ludic_step_s"] / (floor_train + floor_gen_decode)
    summary["engine_vs_generate"] = {k: eng[k] for k in ("engine_tok_s", "generate_tok_s", "ratio", "ratios")}
    summary["memory_bound_mb"] = memory_bound_mb(params)
    summary["rss_over_bound"] = summary["ludic_peak_rss_mb"] / summary["memory_bound_mb"]
    for side in busy:
        if busy[side]:
            summary[f"{side}_contention_slowdown"] = median_step(busy[side]) / median_step(quiet[side])
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="transformers folder (default: the catalogue's)")
    parser.add_argument("--steps", type=int, default=3, help="steps per run (the first is warm-up when > 1)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved Ludic/TRL pairs on the quiet machine")
    parser.add_argument("--quick", action="store_true", help="2 prompts x 2 samples x 8 tokens; 4 x 8 decoding")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--skip-contention", action="store_true")
    parser.add_argument("--out", default="runs/bench_real_model")
    parser.add_argument("--seed", type=int, default=0, help="the runs' seed (sampling, prompt order); not the data set's")
    parser.add_argument("--reward-steps", type=int, default=0,
                        help="also train each side this many steps and compare held-out greedy reward (0: skip)")
    parser.add_argument("--recompute-head-logits", action="store_true",
                        help="Ludic's trainer at its default (keep_head_logits = false): less memory, a slower backward")
    parser.add_argument("--worker", choices=["ludic", "trl", "engine", "eval"], help=argparse.SUPPRESS)
    parser.add_argument("--save", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--folders", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model = args.model or default_model()
    if not Path(args.model).is_dir():
        parser.error(f"model folder {args.model} not found: run `ludic models pull smollm2-135m-instruct` or pass one")
    knobs = QUICK if args.quick else FULL
    if args.worker:
        out = Path(args.out)
        if args.worker == "ludic":
            result = ludic_worker(args.model, args.steps, knobs, out, args.save, args.seed, not args.recompute_head_logits)
        elif args.worker == "trl":
            result = trl_worker(args.model, args.steps, knobs, out, args.save, args.seed)
        elif args.worker == "eval":
            result = eval_worker(args.model, knobs, args.folders, out)
        else:
            result = engine_worker(args.model, knobs, args.rounds)
        print(json.dumps(result))
        return
    summary = report(drive(args), args)
    if args.reward_steps > 0:
        summary["held_out_reward_after_equal_steps"] = drive_reward(args)
    print(f"model {args.model}; knobs {knobs}; lr {LR}; {args.rounds} rounds x {args.steps} steps; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")  # fmt: skip
    print(json.dumps(summary, indent=2))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
