"""``report.md`` of ``gpu_check.py``: one short table or list per section, failures with their traceback."""

from __future__ import annotations

import json
from typing import Any


def render_markdown(report: dict[str, Any]) -> str:
    kind = "dry run (CPU, tiny sizes)" if report.get("dry_run") else "GPU run"
    lines = [f"# GPU check: {kind}", "", f"Commit `{report.get('commit')}`, {report.get('seconds')} s in all.", ""]
    for name, record in report["sections"].items():
        lines += [f"## {name}: {record['status']} ({record['seconds']} s)", ""]
        if "error" in record:
            lines += ["```", record["error"].rstrip(), "```", ""]
        result = record.get("result")
        if result is not None:
            lines += [*RENDER.get(name, _json)(result), ""]
    return "\n".join(lines)


def _json(result: dict[str, Any]) -> list[str]:
    return ["```json", json.dumps(result, indent=2, default=str), "```"]


def _machine(r: dict[str, Any]) -> list[str]:
    keys = ("gpu", "gpus", "gpu_memory_gib", "capability", "driver", "torch", "cuda", "transformers", "python",
            "flex_attention", "bf16_dense_peak_tflops")  # fmt: skip
    rows = [f"- {k}: {r.get(k)}" for k in keys]
    return [*rows, f"- carried: {', '.join(r.get('carried') or []) or 'nothing'}"]


def _gpu_tests(r: dict[str, Any]) -> list[str]:
    c = r["counts"]
    lines = [f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped (pytest exit {r['exit_code']}).", "",
             "| test | outcome | s | why |", "| --- | --- | --- | --- |"]  # fmt: skip
    for t in r["tests"]:
        why = t["message"].splitlines()[0][:160].replace("|", "/") if t["message"] else ""
        lines.append(f"| {t['test']} | {t['outcome']} | {t['seconds']:.1f} | {why} |")
    return lines


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _train(r: dict[str, Any]) -> list[str]:
    lines = [f"{r['params'] / 1e6:.0f}M parameters, {r['tokens_per_step']} tokens a step, "
             f"{r['model_tflop_per_step']:.1f} TFLOP a step (6 N T + causal attention, as plain sequences).", "",
             "| layout | packed | blocks | micro-batches | positions | s/step | tokens/s | MFU | peak GiB | first step s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for mode, m in r["modes"].items():
        lines.append(f"| {mode} | {m['packed']} | {m['block_attention']} | {m['micro_batches']} | {m['positions']} | "
                     f"{m['seconds']:.3f} | {m['tokens_per_s']:.0f} | {_fmt(m['mfu'], '.1%')} | "
                     f"{_fmt(m['peak_memory_gib'], '.1f')} | {m['warmup_seconds']:.2f} |")  # fmt: skip
    padded, packed = r["modes"].get("padded"), r["modes"].get("packed")
    if padded and packed:
        lines += ["", f"packed (block kernel, no half-positions rule) / padded: {padded['seconds'] / packed['seconds']:.2f}x"]
    return lines


def _engine(r: dict[str, Any]) -> list[str]:
    lines = [f"{r['rows']} rows x {r['new_tokens']} new tokens, {r['params'] / 1e6:.0f}M parameters; round 0 warms up.", "",
             "| round | engine tok/s | generate tok/s |", "| --- | --- | --- |"]  # fmt: skip
    for i, row in enumerate(r["rounds"]):
        lines.append(f"| {i} | {row['engine']['tokens_per_s']:.0f} | {row['generate']['tokens_per_s']:.0f} |")
    if "engine_over_generate" in r:
        lines += ["", f"engine / generate (median of timed rounds): {r['engine_over_generate']:.2f}x"]
    return lines


def _quickstart(r: dict[str, Any]) -> list[str]:
    return [f"- reward: {r['eval_initial']:.3f} at start, {r['eval_before_rl']:.3f} after SFT, {r['eval_after']:.3f} after RL",
            f"- {r['rl_seconds_per_step']:.3f} s per RL step, {r['train_seconds']:.1f} s in all",
            f"- `{r['command']}`"]  # fmt: skip


def _determinism(r: dict[str, Any]) -> list[str]:
    lines = []
    for mode, m in r.items():
        if isinstance(m, dict):
            lines.append(f"- {mode}: losses {m['losses']}, equal {m['equal']}, finite {m['finite']}, "
                         f"max |diff| {m['max_abs_diff']:.3g}")  # fmt: skip
    return lines


RENDER = {"machine": _machine, "gpu_tests": _gpu_tests, "train": _train, "engine": _engine,
          "quickstart": _quickstart, "determinism": _determinism}  # fmt: skip
