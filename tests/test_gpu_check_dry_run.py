"""``bench/gpu_check.py --dry-run``: every section of the GPU check runs on the CPU at tiny sizes and
lands in one report, so the script the GPU machine runs cannot rot between loans."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"


def load_gpu_check():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
def test_the_dry_run_runs_every_section_and_writes_one_report(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--dry-run"], capture_output=True, text=True,
                          env=env, timeout=290)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    sections = report["sections"]
    assert list(sections) == ["machine", "gpu_tests", "train", "engine", "quickstart", "determinism"]
    assert {name: s["status"] for name, s in sections.items()} == dict.fromkeys(sections, "ok"), {
        name: s.get("error", "")[-1500:] for name, s in sections.items()
    }
    assert report["dry_run"] is True and report["seconds"] > 0
    tests = sections["gpu_tests"]["result"]["tests"]
    assert any(t["test"].endswith("test_flex_packed_rows_give_the_padded_loss_and_gradients[False-qwen2]") for t in tests)
    assert all(t["outcome"] == "skipped" and t["message"] for t in tests)  # no CUDA here: each says why
    modes = sections["train"]["result"]["modes"]
    assert set(modes) == {"padded", "packed", "packed_default", "packed_dense"}
    assert not modes["padded"]["packed"] and modes["packed"]["packed"] and modes["packed"]["block_attention"]
    assert modes["packed"]["positions"] < modes["padded"]["positions"]  # prompts shared: fewer positions
    assert all(m["tokens_per_s"] > 0 for m in modes.values())
    engine = sections["engine"]["result"]
    assert len(engine["rounds"]) == 3 and engine["engine_over_generate"] > 0
    quick = sections["quickstart"]["result"]
    assert 0 <= quick["eval_before_rl"] <= 1 and 0 <= quick["eval_after"] <= 1 and quick["rl_seconds_per_step"] > 0
    for mode in ("padded", "packed"):
        assert sections["determinism"]["result"][mode]["equal"] and sections["determinism"]["result"][mode]["finite"]
    markdown = (tmp_path / "report.md").read_text()
    for heading in ("## machine: ok", "## gpu_tests: ok", "## train: ok", "## engine: ok", "## quickstart: ok"):
        assert heading in markdown


def test_a_failing_section_is_recorded_with_its_traceback_and_the_next_one_runs(tmp_path, monkeypatch):
    gpu_check = load_gpu_check()
    monkeypatch.setenv("LUDIC_GPU_CHECK_FAIL", "machine")
    assert gpu_check.main([str(tmp_path), "--dry-run", "--only", "machine", "determinism"]) == 0
    sections = json.loads((tmp_path / "report.json").read_text())["sections"]
    assert sections["machine"]["status"] == "failed"
    assert "Traceback" in sections["machine"]["error"] and "LUDIC_GPU_CHECK_FAIL=machine" in sections["machine"]["error"]
    assert sections["determinism"]["status"] == "ok"
    assert "## machine: failed" in (tmp_path / "report.md").read_text()


def test_junit_outcomes_are_read_with_their_reasons(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite><testcase classname="t" name="a" time="1.5"/>'
        '<testcase classname="t" name="b" time="0"><skipped message="needs two GPUs"/></testcase>'
        '<testcase classname="t" name="c" time="0.2"><failure message="assert 1 == 2">trace</failure></testcase>'
        "</testsuite></testsuites>"
    )
    got = load_gpu_check().parse_junit(xml)
    assert [(t["test"], t["outcome"], t["message"]) for t in got] == [
        ("t::a", "passed", ""), ("t::b", "skipped", "needs two GPUs"), ("t::c", "failed", "assert 1 == 2"),
    ]  # fmt: skip
