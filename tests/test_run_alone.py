"""The `alone` phase of scripts/test.sh lists what it should: every entry of tests/conftest.py's RUN_ALONE exists,
and every test file that starts ranks, simulated hosts or a child given both cores is in it (were one left out,
it would compute beside another test on a 2-core machine and slow both many times over, or fail a bound)."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What makes a test file need the machine: ranks (torchrun, a process group), simulated hosts, both cores.
NEEDS_THE_MACHINE = re.compile(r"torchrun|init_process_group|host_network|SimulatedCluster|alone_process_env")


def _conftest(config: pytest.Config) -> ModuleType:
    for plugin in config.pluginmanager.get_plugins():
        if isinstance(plugin, ModuleType) and hasattr(plugin, "RUN_ALONE"):
            return plugin
    raise AssertionError("tests/conftest.py defines no RUN_ALONE")


def test_every_entry_names_a_test_file_or_folder(pytestconfig: pytest.Config) -> None:
    conftest = _conftest(pytestconfig)
    for entry in conftest.RUN_ALONE:
        target = ROOT / entry
        assert target.is_dir() if entry.endswith("/") else target.is_file(), f"RUN_ALONE names {entry}: not there"


def test_every_file_that_starts_ranks_hosts_or_a_two_core_child_runs_alone(pytestconfig: pytest.Config) -> None:
    conftest = _conftest(pytestconfig)
    found = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "tests").rglob("test_*.py"))
             if NEEDS_THE_MACHINE.search(p.read_text())]  # fmt: skip
    found.remove("tests/test_run_alone.py")  # names the patterns above
    found.remove("tests/testing/test_threads.py")  # checks alone_process_env's value, starts nothing
    found.remove("tests/distributed/test_publisher.py")  # a one-rank group in the test's own process
    assert len(found) >= 10  # the pattern still finds the cluster, FSDP and two-core tests
    missing = [p for p in found if not conftest.listed_to_run_alone(p) and not p.startswith("tests/gpu/")]
    assert not missing, f"add these to RUN_ALONE in tests/conftest.py: {missing}"


def test_the_marker_is_set_at_collection(request: pytest.FixtureRequest) -> None:
    """This file is not listed, so its tests run on the two workers; a listed one carries the marker."""
    conftest = _conftest(request.config)
    assert request.node.get_closest_marker("alone") is None
    listed = conftest.listed_to_run_alone
    assert listed("tests/cluster/test_faults.py") and not listed("tests/clusterx/t.py")
