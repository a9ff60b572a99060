"""``scripts/allocator.sh``, sourced by the main job's ``scripts/quickstart.sh``: jemalloc preloaded when the
system has it, with its freed pages handed back within 2 s (the main job's memory bound, docs/real-models.md
"Memory"), glibc on request, a set ``LD_PRELOAD`` or ``MALLOC_CONF`` left alone, a bad choice refused by name."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "allocator.sh"


def library(name: str) -> str | None:
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout if shutil.which("ldconfig") else ""
    return next((line.split()[-1] for line in listing.splitlines() if line.split() and line.split()[0] == name), None)


def source(env: dict[str, str], then: str = 'echo "LD_PRELOAD=${LD_PRELOAD:-}"') -> subprocess.CompletedProcess:
    script = f"source {SCRIPT} && ludic_preload_allocator && {then}"
    return subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", **env},
                          capture_output=True, text=True)  # fmt: skip


@pytest.mark.skipif(library("libjemalloc.so.2") is None, reason="scripts/setup.sh installs libjemalloc2")
def test_the_main_job_runs_on_jemalloc_when_the_system_has_it() -> None:
    done = source({}, then="cat /proc/self/maps")  # a process started under the preload maps it
    assert done.returncode == 0, done.stderr
    assert "libjemalloc.so.2" in done.stdout and "allocator:" in done.stderr
    conf = source({}, then='echo "MALLOC_CONF=$MALLOC_CONF"').stdout.strip()
    assert conf == "MALLOC_CONF=background_thread:true,dirty_decay_ms:2000,muzzy_decay_ms:0"  # freed pages back in 2 s
    assert source({"MALLOC_CONF": "narenas:1"}, then='echo "$MALLOC_CONF"').stdout.strip() == "narenas:1"  # a user's kept


@pytest.mark.skipif(library("libjemalloc.so.2") is None or not Path("/sbin/ldconfig").exists(), reason="no jemalloc")
def test_found_without_sbin_on_the_path_and_under_the_quickstarts_strict_mode() -> None:
    """A user's PATH often lacks /sbin (where ldconfig lives); the quickstart runs under ``set -euo pipefail``."""
    script = f"set -euo pipefail; source {SCRIPT}; ludic_preload_allocator; echo \"$LD_PRELOAD\""
    done = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().endswith("libjemalloc.so.2"), done.stderr


def test_glibc_on_request_and_a_set_preload_is_left_alone() -> None:
    assert source({"LUDIC_ALLOCATOR": "glibc"}).stdout.strip() == "LD_PRELOAD="
    assert source({"LD_PRELOAD": "/some/lib.so"}).stdout.strip() == "LD_PRELOAD=/some/lib.so"


def test_an_unknown_allocator_is_refused_by_name() -> None:
    done = source({"LUDIC_ALLOCATOR": "mimalloc"})
    assert done.returncode == 2 and "LUDIC_ALLOCATOR must be jemalloc, tcmalloc or glibc, got 'mimalloc'" in done.stderr
