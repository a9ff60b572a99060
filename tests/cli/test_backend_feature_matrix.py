"""The backend x feature matrix: every combination ``--dry-run`` accepts runs one step; the others are refused.

Backends, the last two against Ludic's server, a subprocess on loopback (a real ``vllm serve`` needs a GPU):
- ``embedded``: the in-process engine;
- ``server``: ``VLLMChatClient`` sampling over ``/v1/completions``, the weights uploaded as one blob to Ludic's
  own ``/ludic/update_weights_blob`` (a LoRA run's adapter alone);
- ``vllm``: the same client, the weights over vLLM's weight-transfer routes (``/init_weight_transfer_engine``,
  ``/update_weights``, ...) and a gloo group, as against ``vllm serve`` (NCCL on a GPU): only what a vLLM
  server accepts, so a LoRA run publishes merged weights.
Features: an SFT warm start, LoRA (publishing its adapter, and merged), pipeline mode (a private Redis), an
OpenAI-SDK agent program (the ``openai_program`` kind) and ``ludic eval``.

The server cases share one server, restarted only after a case published to it: a fresh run needs the base
served at version 0, and ``--dry-run`` refuses one whose server serves an earlier run's weights (each
publishing case checks that refusal before the restart)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ludic.cli import main
from ludic.cli.warm_start import BEFORE_SFT_STEP
from ludic.testing.run_config import tiny_run_toml
from ludic.testing.server_process import start_server, stop_server

pytestmark = pytest.mark.integration

BACKENDS = ("embedded", "server", "vllm")
FEATURES = ("sft", "lora", "lora_merged", "pipeline", "program", "eval")
REMOTE = ("server", "vllm")
# (backend, feature) -> what --dry-run says when it refuses the combination
PROGRAM_NEEDS_HTTP = "an OpenAI-SDK program samples from an HTTP server that must receive the trained"
VLLM_NO_ADAPTER = (
    'vLLM serves a runtime adapter only under its own model name, never as the policy the run samples; set [lora] '
    'publish = "merged"'
)
REFUSED = {("embedded", "program"): PROGRAM_NEEDS_HTTP, ("vllm", "lora"): VLLM_NO_ADAPTER}

PROGRAM = '''
async def repeat(client, task):
    reply = await client.chat.completions.create(
        model=task.model, messages=[{"role": "user", "content": task.prompt}], max_tokens=3)
    return reply.choices[0].message.content
'''


def _tables(folder: Path, backend: str, feature: str, server: str) -> str:
    tables = f"""
[eval]
num_episodes = 1
sampling = {{ temperature = 0.0, max_tokens = 2 }}
[trainer]
lr = 1e-3
max_seq_len = 64
micro_token_budget = 512
[logging]
output_dir = "{folder / "out"}"
rich = false
plot = false
"""
    if backend in REMOTE:
        tables += f'[inference]\nbackend = "{backend}"\nserver_url = "{server}"\n'
    if feature == "sft":
        demos = folder / "demos.jsonl"
        demos.write_text("".join(json.dumps({"prompt": f"Repeat {c}", "answer": c * 2}) + "\n" for c in "ab"))
        tables += f'[sft]\nsteps = 1\nbatch_size = 2\ndemonstrations = "{demos}"\n'
    elif feature in ("lora", "lora_merged"):
        tables += '[lora]\nrank = 2\ntargets = ["q_proj", "v_proj"]\n'
        tables += 'publish = "merged"\n' if feature == "lora_merged" else ""
    elif feature == "pipeline":
        tables += "[pipeline]\nenabled = true\nactors = 1\n"
    elif feature == "program":
        (folder / "matrix_program.py").write_text(PROGRAM)
        tables += '[protocol]\nname = "openai_program"\nkwargs = { program = "matrix_program:repeat" }\n'
    return tables


def _write(folder: Path, model: Path, backend: str, feature: str, server: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = tiny_run_toml(model, steps=1, tables=_tables(folder, backend, feature, server))
    if feature == "program":
        text = 'imports = ["matrix_program.py"]\n' + text
    path = folder / "run.toml"
    path.write_text(text)
    return path


def _cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, err.getvalue()


class Server:
    """Ludic's server on ``model_dir`` for the ``server`` and ``vllm`` cases, restarted only when a case left it at a policy
    version above 0 (a fresh run needs the base served at version 0: ``--dry-run`` refuses it otherwise)."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir, self.proc, self.url = model_dir, None, ""

    def fresh(self) -> str:
        if self.proc is not None and self.version() > 0:
            stop_server(self.proc)
            self.proc = None
        if self.proc is None:
            self.proc, self.url = start_server(self.model_dir)
        return self.url

    def version(self) -> int:
        return int(httpx.get(self.url + "/policy_version", timeout=10).json()["policy_version"])


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[Server]:
    held = Server(model_dir)
    yield held
    if held.proc is not None:
        stop_server(held.proc)


@pytest.fixture(autouse=True)
def restore_modules() -> Iterator[None]:
    """A case's ``imports`` (matrix_program) must not leak into the next case's sys.modules."""
    modules, path = set(sys.modules), list(sys.path)
    yield
    for name in set(sys.modules) - modules:
        if name == "matrix_program":
            del sys.modules[name]
    sys.path[:] = path


def _cases() -> list:
    """Every (backend, feature); a case on a server restarts it when the last one published (10-12 s a case on a
    2-core machine, mostly the server's start), so those run with the slow tests (CI runs them)."""
    return [
        pytest.param(backend, feature, id=f"{backend}-{feature}", marks=[pytest.mark.slow] if backend in REMOTE else [])
        for backend in BACKENDS
        for feature in FEATURES
    ]


@pytest.mark.parametrize(("backend", "feature"), _cases())
def test_each_combination_runs_one_step_or_is_refused(
    tmp_path: Path, model_dir: Path, server: Server, backend: str, feature: str
) -> None:
    url = "http://127.0.0.1:9"  # unused by the embedded cases
    reason = REFUSED.get((backend, feature))
    if backend in REMOTE:  # evaluation and a refused run publish nothing: any version served will do
        any_version = feature == "eval" or reason is not None
        url = server.url if any_version and server.proc is not None else server.fresh()
    config = _write(tmp_path, model_dir, backend, feature, url)
    command = "eval" if feature == "eval" else "train"
    code, err = _cli(command, str(config), "--dry-run")
    if reason is not None:
        assert code == 2 and reason in err, err
        return
    assert (code, err) == (0, ""), err
    code, err = _cli(command, str(config))
    assert code == 0, err
    out = tmp_path / "out"
    if feature == "eval":
        summary = json.loads(next((out / "eval").glob("*summary.json")).read_text())
        assert summary["eval/num_episodes"] == 1.0 and summary["eval/failed_rollouts"] == 0.0, summary
        return
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in steps] == [1], records
    assert steps[0]["train/num_samples"] >= 1 and steps[0]["train/staleness_max"] == 0.0
    if feature == "sft":
        assert (out / "eval" / f"eval_step_{BEFORE_SFT_STEP}_summary.json").is_file()  # evaluated before the SFT
    if feature == "pipeline":
        assert "train/pipeline/trainer_version" in steps[0]
    else:  # the step's publish: vLLM's routes (packing, the server's receive) or the blob upload
        assert ("perf/publish_pack_s" in steps[0]) == (backend == "vllm"), steps[0]
        assert ("perf/server_receive_s" in steps[0]) == (backend == "vllm"), steps[0]
        assert steps[0]["perf/publish_bytes"] > 0
    if backend in REMOTE:
        # The server now serves this run's step 1: a second fresh run on it is refused, with the fix (it
        # passed --dry-run and then sampled from the earlier run's weights and died at its first publish).
        assert server.version() == 1
        again = _write(tmp_path / "again", model_dir, backend, feature, url)
        sys.modules.pop("matrix_program", None)  # the second config imports its own copy
        code, err = _cli(command, str(again), "--dry-run")
        assert code == 2 and "serves policy_version 1, published by an earlier run" in err, err
        assert "restart the server" in err
