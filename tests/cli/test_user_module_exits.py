"""A user module that exits or is interrupted while importing never ends ``ludic`` silently (issue 37)."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ludic.cli import main
from ludic.registry import ENV_REGISTRY

CONFIG = """imports = ["{module}.py"]
steps = 1
[model]
path = "nowhere"
[env]
name = "letter_repeat"
[logging]
output_dir = "{out}"
rich = false
"""
REGISTERS = """from ludic.envs import LetterRepeatEnv
from ludic.registry import register_env
register_env("{module}_env")(lambda: LetterRepeatEnv(count=1, letters="ab"))
"""


@pytest.fixture(autouse=True)
def restore_registry_and_modules() -> Iterator[None]:
    entries, modules, path = dict(ENV_REGISTRY._entries), set(sys.modules), list(sys.path)
    yield
    ENV_REGISTRY._entries = entries
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    sys.path[:] = path


def _config(tmp_path: Path, module: str, body: str) -> Path:
    (tmp_path / f"{module}.py").write_text(REGISTERS.format(module=module) + body)
    path = tmp_path / "run.toml"
    path.write_text(CONFIG.format(module=module, out=tmp_path / "out"))
    return path


def _ludic(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("call", "shown"), [("sys.exit(0)", "0"), ("sys.exit()", "None"), ("raise SystemExit(4)", "4")]
)
def test_a_module_calling_sys_exit_at_import_is_a_config_error_naming_it(tmp_path, call, shown):
    module = f"exits_{abs(hash(call)) % 1000}"
    cfg = _config(tmp_path, module, f"import sys\n{call}\n")
    code, out, err = _ludic("train", str(cfg), "--dry-run")
    assert code == 2 and out == ""
    assert f"imports: importing '{module}.py' called sys.exit({shown}) ({module}.py:5)" in err
    assert f"{module}_env" not in ENV_REGISTRY and module not in sys.modules  # nothing left behind


def test_keyboard_interrupt_at_import_exits_130_with_one_line(tmp_path):
    cfg = _config(tmp_path, "interrupts", "raise KeyboardInterrupt\n")
    code, out, err = _ludic("train", str(cfg), "--dry-run")
    assert (code, out, err) == (130, "", "ludic train: interrupted\n")
    assert "interrupts_env" not in ENV_REGISTRY


def test_the_ludic_process_exits_nonzero_with_the_reason(tmp_path):
    cfg = _config(tmp_path, "exits_proc", "import sys\nsys.exit(0)\n")
    done = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", str(cfg), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "importing 'exits_proc.py' called sys.exit(0)" in done.stderr and "Traceback" not in done.stderr


def test_sys_exit_from_an_env_factory_the_dry_run_builds_is_never_a_silent_success(tmp_path):
    cfg = _config(tmp_path, "exits_late", "import sys\nregister_env('exits_late_bad')(lambda: sys.exit(0))\n")
    cfg.write_text(cfg.read_text().replace('name = "letter_repeat"', 'name = "exits_late_bad"'))
    code, out, err = _ludic("train", str(cfg), "--dry-run")
    assert (code, out) == (1, "")
    assert err == "ludic train: stopped by sys.exit(0) from code the run called\n"
