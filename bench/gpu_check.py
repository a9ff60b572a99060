"""One run that proves the GPU path, writing one report (``report.md`` and ``report.json``) to OUT_DIR.

    bash scripts/gpu_check.sh OUT_DIR            # on the GPU machine (at most 8 minutes on one H100)
    python bench/gpu_check.py OUT_DIR --dry-run  # every section at tiny sizes on the CPU (the test suite)

Sections (``gpu_check_sections.py``): the machine; the ``gpu``-marked tests, each passed / failed /
why skipped (pytest's JUnit XML); a training step at ~0.5B bf16 with activation checkpointing (tokens/s,
MFU against the GPU's dense bf16 peak, peak memory; padded vs packed with prompt sharing, the packed
layout by FlexAttention and by the dense mask, and what today's half-positions rule picks); the
embedded engine against one batched ``model.generate`` at 32 x 128 new tokens; ``ludic quickstart
--device cuda`` (reward before and after, seconds per step); the same seed twice (equal, finite losses).

Each section runs in a subprocess of its own with a time budget (``SECTIONS``; 455 s in all): one that
fails or overruns is recorded with its traceback or output tail, and the next one runs. ``--dry-run``
runs them in this process (faster on a CPU), at ``Sizes.dry()``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_sections as sections

SECTIONS = {"machine": 15, "gpu_tests": 120, "train": 140, "engine": 50, "quickstart": 90, "determinism": 40}
"""Section -> seconds it may take on the GPU machine (its subprocess is killed 15 s after)."""
GRACE = 15


def gpu_tests(sizes: sections.Sizes, deadline: float, out_dir: Path) -> dict[str, Any]:
    """``pytest -m gpu tests/gpu``: each test's outcome (and why it was skipped or failed)."""
    xml = out_dir / "gpu_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/gpu", "-o", "addopts=", "-m", "gpu", "-p", "no:cacheprovider",
           "--import-mode=importlib", "-q", "-rs", f"--junitxml={xml}"]  # fmt: skip
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd.append("--timeout=90")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(sections.ROOT / "src"), str(sections.ROOT),
                                                        os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    proc = subprocess.run(cmd, cwd=sections.ROOT, capture_output=True, text=True, env=env,
                          timeout=max(1.0, deadline - time.monotonic()))  # fmt: skip
    if not xml.exists():
        raise RuntimeError(f"pytest wrote no report (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    tests = parse_junit(xml)
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "skipped")}
    return {"exit_code": proc.returncode, "counts": counts, "tests": tests, "tail": proc.stdout[-1500:]}


def parse_junit(path: Path) -> list[dict[str, Any]]:
    """Each ``<testcase>``: its id, outcome and the message of a failure, error or skip."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (node.get("message") or node.text or "").strip()[:600]
                break
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        out.append({"test": name, "outcome": outcome, "seconds": float(case.get("time") or 0), "message": message})
    return out


def run_section(name: str, sizes: sections.Sizes, budget: float, out_dir: Path) -> dict[str, Any]:
    """Run one section here; its result, or its traceback, never an exception."""
    start = time.monotonic()
    deadline = start + budget
    try:
        if os.environ.get("LUDIC_GPU_CHECK_FAIL") == name:  # lets a test show that a failure is contained
            raise RuntimeError(f"LUDIC_GPU_CHECK_FAIL={name}")
        if name in ("gpu_tests", "quickstart"):
            fn = gpu_tests if name == "gpu_tests" else sections.quickstart
            result = fn(sizes, deadline, out_dir)
        else:
            result = getattr(sections, name)(sizes, deadline)
        status = "partial" if result.get("partial") else "ok"
        return {"status": status, "seconds": round(time.monotonic() - start, 2), "result": result}
    except Exception:
        return {"status": "failed", "seconds": round(time.monotonic() - start, 2), "error": traceback.format_exc()[-6000:]}


def run_isolated(name: str, budget: float, out_dir: Path, dry: bool) -> dict[str, Any]:
    """Run one section in a subprocess, killed ``GRACE`` s after its budget."""
    start = time.monotonic()
    cmd = [sys.executable, __file__, str(out_dir), "--section", name] + (["--dry-run"] if dry else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget + GRACE)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-3000:]
        tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
        return {"status": "timed out", "seconds": round(time.monotonic() - start, 2),
                "error": f"killed after {budget + GRACE:.0f} s; stderr tail:\n{tail}"}  # fmt: skip
    result_file = out_dir / "sections" / f"{name}.json"
    if proc.returncode != 0 or not result_file.exists():
        return {"status": "failed", "seconds": round(time.monotonic() - start, 2),
                "error": f"exit {proc.returncode}; stderr tail:\n{proc.stderr[-4000:]}"}  # fmt: skip
    return json.loads(result_file.read_text())


def commit() -> str:
    env = os.environ.get("LUDIC_COMMIT")
    if env:
        return env
    marker = sections.ROOT / ".gpu_carry" / "COMMIT"
    if marker.exists():
        return marker.read_text().strip()
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=sections.ROOT, capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--dry-run", action="store_true", help="every section at tiny sizes on the CPU, in this process")
    p.add_argument("--section", choices=list(SECTIONS), help="run one section and write sections/NAME.json")
    p.add_argument("--only", nargs="+", choices=list(SECTIONS), help="run only these sections")
    args = p.parse_args(argv)
    sizes = sections.Sizes.dry() if args.dry_run else sections.Sizes.full()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "sections").mkdir(exist_ok=True)
    if args.section:
        record = run_section(args.section, sizes, SECTIONS[args.section], args.out_dir)
        (args.out_dir / "sections" / f"{args.section}.json").write_text(json.dumps(record, indent=2, default=str))
        return 0
    started = time.monotonic()
    report: dict[str, Any] = {"commit": commit(), "dry_run": args.dry_run, "sizes": asdict(sizes),
                              "budgets_s": SECTIONS, "sections": {}}  # fmt: skip
    for name, budget in SECTIONS.items():
        if args.only and name not in args.only:
            continue
        print(f"[gpu_check] {name} (budget {budget} s) ...", flush=True)
        if args.dry_run:
            record = run_section(name, sizes, budget, args.out_dir)
        else:
            record = run_isolated(name, budget, args.out_dir, args.dry_run)
        report["sections"][name] = record
        print(f"[gpu_check] {name}: {record['status']} in {record['seconds']} s", flush=True)
        write_report(report, args.out_dir, time.monotonic() - started)  # a report even if killed later
    print(f"[gpu_check] report: {args.out_dir / 'report.md'}")
    return 0


def write_report(report: dict[str, Any], out_dir: Path, seconds: float) -> None:
    from gpu_check_report import render_markdown

    report["seconds"] = round(seconds, 1)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out_dir / "report.md").write_text(render_markdown(report))


if __name__ == "__main__":
    sys.exit(main())
