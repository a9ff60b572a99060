"""The ``openai_program`` protocol kind: a ``ludic train`` config names an OpenAI-SDK program as
``"module:function"`` from a module its ``imports`` key loads."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ludic.cli import main
from ludic.inference import VLLMChatClient
from ludic.interaction import OpenAIProgramProtocol
from ludic.registry import PROTOCOL_REGISTRY
from ludic.registry.openai_program import openai_program_protocol, resolve_program

PROGRAMS = '''
async def answer_twice(client, task):
    first = await client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": task.prompt}])
    return first.choices[0].message.content
'''

CONFIG = """imports = ["my_programs_k.py"]
steps = 1
[model]
path = "nowhere"
[env]
name = "letter_repeat"
[inference]
backend = "server"
server_url = "http://127.0.0.1:8123"
[protocol]
name = "openai_program"
kwargs = {kwargs}
[logging]
output_dir = "{out}"
rich = false
"""


@pytest.fixture(autouse=True)
def restore_modules() -> Iterator[None]:
    path = list(sys.path)
    yield
    # only the test's own module: dropping every module first imported here (httpx, httpcore, ...) left
    # later tests with two copies of their exception classes (a ConnectError no handler caught)
    sys.modules.pop("my_programs_k", None)
    sys.path[:] = path


def _dry_run(tmp_path: Path, kwargs: str) -> tuple[int, str, str]:
    cfg = tmp_path / "conf" / "run.toml"
    cfg.parent.mkdir(exist_ok=True)
    (cfg.parent / "my_programs_k.py").write_text(PROGRAMS)
    cfg.write_text(CONFIG.format(kwargs=kwargs, out=tmp_path / "out"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train", str(cfg), "--dry-run"])
    return code, out.getvalue(), err.getvalue()


def test_a_config_naming_a_program_from_its_imports_passes_dry_run(tmp_path: Path) -> None:
    code, out, err = _dry_run(tmp_path, '{ program = "my_programs_k:answer_twice" }')
    assert (code, err) == (0, "")
    assert '"name": "openai_program"' in out


def test_dry_run_refuses_a_program_kind_without_program_or_with_an_unknown_kwarg(tmp_path: Path) -> None:
    code, _, err = _dry_run(tmp_path, "{ }")
    assert code == 2 and "[protocol].kwargs: protocol 'openai_program'" in err and "program" in err
    code, _, err = _dry_run(tmp_path, '{ program = "my_programs_k:answer_twice", base = "x" }')
    assert code == 2 and "unexpected keyword argument 'base'" in err


def test_the_kind_builds_the_protocol_against_the_runs_server(tmp_path: Path) -> None:
    (tmp_path / "my_programs_k.py").write_text(PROGRAMS)
    sys.path.insert(0, str(tmp_path))
    agent = type("Agent", (), {"client": VLLMChatClient(base_url="http://127.0.0.1:8123/"), "model": "m"})()
    protocol = PROTOCOL_REGISTRY.get("openai_program")(agent=agent, program="my_programs_k:answer_twice")
    assert isinstance(protocol, OpenAIProgramProtocol)
    assert (protocol.base_url, protocol.model) == ("http://127.0.0.1:8123/v1", "m")
    assert protocol.program is sys.modules["my_programs_k"].answer_twice


def test_bad_program_names_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must look like 'module:function', got 'no_colon'"):
        resolve_program("no_colon")
    with pytest.raises(ValueError, match="cannot import 'no_such_mod_q'"):
        resolve_program("no_such_mod_q:f")
    with pytest.raises(ValueError, match="'json' has no callable 'nope'"):
        resolve_program("json:nope")


def test_an_embedded_backend_is_refused_with_the_fix() -> None:
    agent = type("Agent", (), {"client": object(), "model": "m"})()
    with pytest.raises(ValueError, match='backend = "server"'):
        openai_program_protocol(agent=agent, program="json:dumps")
