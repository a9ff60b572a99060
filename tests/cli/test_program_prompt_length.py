"""``--dry-run`` sees an OpenAI-SDK program's prompt: its first request (its own system prompt, the env's
observation, its tools) is captured from the real ``openai`` client without a model or server, rendered
with the chat template and measured against ``[trainer].max_seq_len`` (it used to fail at step 1)."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ludic.cli import main
from ludic.cli.program_prompt import first_request
from ludic.interaction.openai_program import ProgramTask

pytest.importorskip("openai")

PROGRAMS = """
RULES = "You are a careful assistant. " * 30          # about 900 characters: 900 tokens on the byte-level tiny model
CALC = {"type": "function", "function": {"name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}}

async def long_rules(client, task):
    reply = await client.chat.completions.create(
        model=task.model, messages=[{"role": "system", "content": RULES}, {"role": "user", "content": task.prompt}])
    return reply.choices[0].message.content

def with_tools(client, task):  # a sync program; its tools block is what fills the prompt
    reply = client.chat.completions.create(
        model=task.model, messages=[{"role": "user", "content": task.prompt}], tools=[CALC] * 4)
    return reply.choices[0].message.content

def never_calls(client, task):
    raise RuntimeError("decides not to call the model")
"""

CONFIG = """imports = ["my_programs_p.py"]
steps = 1
[model]
path = "{model}"
[env]
name = "letter_repeat"
[inference]
backend = "server"
server_url = "http://127.0.0.1:9"
[protocol]
name = "openai_program"
kwargs = {{ program = "my_programs_p:{program}" }}
[trainer]
max_seq_len = {max_seq_len}
[logging]
output_dir = "{out}"
rich = false
"""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ludic.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(autouse=True)
def forget_programs() -> Iterator[None]:
    path = list(sys.path)
    yield
    sys.modules.pop("my_programs_p", None)  # only the test's module: libraries imported here stay whole
    sys.path[:] = path


def _dry_run(tmp_path: Path, model: Path, program: str, max_seq_len: int) -> tuple[int, str]:
    cfg = tmp_path / "conf" / "run.toml"
    cfg.parent.mkdir(exist_ok=True)
    (cfg.parent / "my_programs_p.py").write_text(PROGRAMS)
    cfg.write_text(CONFIG.format(model=model, program=program, max_seq_len=max_seq_len, out=tmp_path / "out"))
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["train", str(cfg), "--dry-run"])
    return code, err.getvalue()


def test_a_program_whose_own_system_prompt_fills_max_seq_len_is_refused(
    tmp_path: Path, tiny_model: Path
) -> None:
    code, err = _dry_run(tmp_path, tiny_model, "long_rules", 512)
    assert code == 2, (
        err
    )  # was: accepted (the plain check sees only the ~20-token observation), failing at step 1
    assert "[trainer].max_seq_len: 512 leaves no reply token: program 'my_programs_p:long_rules'" in err
    assert "2 messages" in err and "raise max_seq_len" in err
    assert _dry_run(tmp_path, tiny_model, "long_rules", 2048)[0] == 0


def test_a_sync_programs_tools_count_too(tmp_path: Path, tiny_model: Path) -> None:
    code, err = _dry_run(tmp_path, tiny_model, "with_tools", 512)
    assert code == 2 and "1 messages and 4 tools" in err, err
    assert _dry_run(tmp_path, tiny_model, "with_tools", 8192)[0] == 0


def test_a_program_that_makes_no_request_is_left_to_the_run(tmp_path: Path, tiny_model: Path) -> None:
    assert _dry_run(tmp_path, tiny_model, "never_calls", 512)[0] == 0


def test_the_first_request_is_captured_not_sent() -> None:
    seen = []

    async def program(client, task):
        seen.append("called")
        await client.chat.completions.create(
            model=task.model, messages=[{"role": "user", "content": task.prompt}]
        )
        seen.append("answered")  # never: nothing answers

    body = first_request(program, ProgramTask("say hi", None, "m"))
    assert body == {"model": "m", "messages": [{"role": "user", "content": "say hi"}]} and seen == ["called"]
