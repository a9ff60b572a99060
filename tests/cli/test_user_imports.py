"""``imports = [...]`` and ``--import``: the user's modules register their envs before names are checked."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ludic.cli import main
from ludic.registry import ENV_REGISTRY

USER_ENV = '''
from ludic.envs import LetterRepeatEnv
from ludic.registry import register_env

@register_env("{name}")
def make(count: int = 2):
    return LetterRepeatEnv(count=count, letters="ab")
'''

CONFIG = """{imports}
steps = 1
[model]
path = "nowhere"
[env]
name = "{env}"
kwargs = {{ count = 3 }}
[logging]
output_dir = "{out}"
rich = false
"""


@pytest.fixture(autouse=True)
def restore_registry_and_modules() -> Iterator[None]:
    entries, modules, path = dict(ENV_REGISTRY._entries), set(sys.modules), list(sys.path)
    yield
    ENV_REGISTRY._entries = entries
    for name in set(sys.modules) - modules:
        del sys.modules[name]
    sys.path[:] = path


def _ludic(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _config(tmp_path: Path, env: str, imports: str = "") -> Path:
    path = tmp_path / "conf" / "run.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(CONFIG.format(imports=imports, env=env, out=tmp_path / "out"))
    return path


def test_config_imports_a_py_file_next_to_it_and_its_env_is_found(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "user_env_a", 'imports = ["envs/mine_a.py"]')
    (cfg.parent / "envs").mkdir()
    (cfg.parent / "envs" / "mine_a.py").write_text(USER_ENV.format(name="user_env_a"))
    code, out, err = _ludic("train", str(cfg), "--dry-run")
    assert (code, err) == (0, "")
    assert '"imports": [\n    "envs/mine_a.py"\n  ]' in out
    assert ENV_REGISTRY.build("user_env_a", count=3).count == 3


def test_import_flag_takes_a_dotted_module_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine_b.py").write_text(USER_ENV.format(name="user_env_b"))
    monkeypatch.chdir(tmp_path)
    code, out, _ = _ludic("list", "--import", "mine_b")
    assert code == 0 and "user_env_b" in out.splitlines()[0]
    cfg = _config(tmp_path, "user_env_b")
    assert _ludic("eval", str(cfg), "--dry-run", "--import", "mine_b")[0] == 0


def test_without_the_import_the_env_is_unknown(tmp_path: Path) -> None:
    code, _, err = _ludic("train", str(_config(tmp_path, "user_env_c")), "--dry-run")
    assert code == 2 and "[env].name: unknown env 'user_env_c'" in err


def test_a_module_that_raises_is_named_and_leaves_nothing_registered(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "user_env_d", 'imports = ["broken_d.py"]')
    (cfg.parent / "broken_d.py").write_text(USER_ENV.format(name="user_env_d") + "raise ValueError('boom')\n")
    code, out, err = _ludic("train", str(cfg), "--dry-run")
    assert code == 2 and out == ""
    assert "  imports: importing 'broken_d.py' failed: ValueError: boom (broken_d.py:8)" in err
    assert "user_env_d" not in ENV_REGISTRY and "broken_d" not in sys.modules


def test_a_missing_module_is_named(tmp_path: Path) -> None:
    code, _, err = _ludic("train", str(_config(tmp_path, "x")), "--dry-run", "--import", "no_such_mod_e")
    assert code == 2 and "imports: cannot import 'no_such_mod_e': no module named 'no_such_mod_e'" in err
    code, _, err = _ludic("list", "--import", str(tmp_path / "missing.py"))
    assert code == 2 and "missing.py' is not a .py file" in err


def test_a_blank_import_entry_is_a_config_error(tmp_path: Path) -> None:
    code, _, err = _ludic("train", str(_config(tmp_path, "x", 'imports = ["  "]')), "--dry-run")
    assert code == 2 and "imports[0] is empty" in err
