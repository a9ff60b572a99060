"""docs/walkthrough.md's seven scenarios: each checked-in config passes ``ludic train --dry-run`` as written and
on the tiny model, (slow) trains 2 steps on the tiny model, and leaves the outputs the page names.

The folders hold no Python but what a user brings (a reward function, an agent program, a verifiers taskset):
LoRA, loggers, checkpoints, evaluation and export come from the config and the ``ludic`` command alone.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ludic.cli import main

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WALK = REPO / "examples" / "walkthrough"
PAGE = REPO / "docs" / "walkthrough.md"
SCENARIOS = ("reasoning_gym", "tool_agent", "textarena", "verifiers", "jsonl_reward", "jsonl_lora")
USERS_OWN_CODE = {  # the only Python in the folders, each what the scenario's user brings
    "jsonl_reward/antonym_reward.py": "the reward function",
    "tool_agent/calculator_agent.py": "the OpenAI-SDK agent program",
    "verifiers/plural_taskset.py": "the verifiers taskset",
}
USER_MODULES = ("antonym_reward", "calculator_agent", "plural_taskset")
# the tiny model's byte-level tokenizer spends a token per character: the agent's system prompt and tool
# schema take ~600 (SmolLM2's BPE: ~200, within the config's 512)
TINY = {"tool_agent": ["--set", "trainer.max_seq_len=2048"]}


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def from_the_repository(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The configs' data paths are relative to the repository root, where the page's commands run; the user's
    modules are dropped afterwards (each test imports its own copy)."""
    monkeypatch.chdir(REPO)
    path = list(sys.path)
    yield
    sys.path[:] = path
    for name in USER_MODULES:
        sys.modules.pop(name, None)


def test_the_folders_hold_no_python_but_the_users_own() -> None:
    found = {str(p.relative_to(WALK)) for p in WALK.rglob("*.py")}
    assert found == set(USERS_OWN_CODE), f"unexpected Python in examples/walkthrough: {found - set(USERS_OWN_CODE)}"
    assert sorted(p.parent.name for p in WALK.glob("*/run.toml")) == sorted(SCENARIOS)


def test_the_page_gives_each_scenario_its_config_and_command() -> None:
    page = PAGE.read_text()
    for name in SCENARIOS:
        assert f"ludic train examples/walkthrough/{name}/run.toml" in page, name
    for path in USERS_OWN_CODE:
        assert f"examples/walkthrough/{path}" in page, path
    assert "ludic export runs/walkthrough/jsonl_lora" in page and "ludic eval examples/walkthrough/" in page
    assert "walkthrough.md" in (REPO / "docs" / "index.md").read_text()
    assert "docs/walkthrough.md" in (REPO / "README.md").read_text()


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_config_passes_the_dry_run_as_written_and_on_the_tiny_model(
    name: str, tmp_path: Path, model_dir: Path
) -> None:
    config = str(WALK / name / "run.toml")
    code, out, err = _cli("train", config, "--dry-run", "--output-dir", str(tmp_path / "a"))
    assert (code, err) == (0, ""), err  # the catalogue model the page uses (its folder when prepared)
    assert json.loads(out)["steps"] == 30
    code, out, err = _cli("train", config, "--dry-run", "--output-dir", str(tmp_path / "b"),
                          "--set", f"model.path={model_dir}", *TINY.get(name, []))  # fmt: skip
    assert (code, err) == (0, ""), err
    assert json.loads(out)["model"]["path"] == str(model_dir)


def test_the_dry_run_names_the_tool_agents_prompt_when_max_seq_len_is_too_small(
    tmp_path: Path, model_dir: Path
) -> None:
    code, _, err = _cli("train", str(WALK / "tool_agent" / "run.toml"), "--dry-run",
                        "--set", f"model.path={model_dir}", "--output-dir", str(tmp_path))  # fmt: skip
    assert code == 2 and "calculator_agent:solve" in err and "raise max_seq_len" in err, err


def test_the_tool_agents_demonstrations_are_what_its_program_sends() -> None:
    """demos.jsonl (the SFT warm start of the tool agent) repeats the program's system prompt and tool schema,
    so the warm start sees the prompt ids the program sends; each call reads back through the server's parser
    (hermes) as a calculator call whose result is the next turn's tool message and answer."""
    import importlib.util

    from ludic.inference.tool_parsers import get_tool_parser

    spec = importlib.util.spec_from_file_location("walkthrough_agent", WALK / "tool_agent" / "calculator_agent.py")
    assert spec is not None and spec.loader is not None
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    lines = [json.loads(x) for x in (WALK / "tool_agent" / "demos.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for x in (WALK / "tool_agent" / "train.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * len(rows)
    parser = get_tool_parser("hermes")
    for row, call, result in zip(rows, lines[::2], lines[1::2]):
        assert call["prompt"] == [{"role": "system", "content": agent.SYSTEM}, {"role": "user", "content": row["question"]}]
        assert call["tools"] == result["tools"] == [agent.CALCULATOR]
        (parsed,) = parser.parse(call["answer"]).tool_calls
        assert parsed.name == "calculator" and agent.calculator(parsed.arguments) == row["answer"]
        assert result["prompt"][:2] == call["prompt"] and result["prompt"][2]["content"] == call["answer"]
        assert result["prompt"][3]["content"] == result["answer"] == row["answer"]


def _train_briefly(name: str, out: Path, model_dir: Path, *extra: str) -> None:
    """2 RL steps of 2 prompts x 2 (after 2 SFT steps where the config warm-starts) on the tiny model."""
    argv = ["train", str(WALK / name / "run.toml"), "--steps", "2", "--output-dir", str(out),
            "--set", f"model.path={model_dir}", "--set", "rollout.prompts_per_step=2",
            "--set", "rollout.group_size=2", "--set", "eval.num_episodes=2", "--set", "logging.rich=false",
            "--set", "logging.completions_every=1", *TINY.get(name, []), *extra]  # fmt: skip
    if "[sft]" in (WALK / name / "run.toml").read_text():
        argv += ["--set", "sft.steps=2", "--set", "sft.batch_size=2"]
    code, _, err = _cli(*argv)
    assert code == 0, err


def _check_run_outputs(out: Path) -> None:
    """What every run leaves (docs/walkthrough.md, "7. What a run leaves")."""
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    episodes = [json.loads(x) for x in (out / "eval" / "eval_step_2.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 and all(e["steps"] and "total_reward" in e for e in episodes)
    assert (out / "eval" / "eval_step_0_summary.json").is_file()  # before RL
    samples = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert samples and {"prompt", "reply", "reward"} <= set(samples[0])
    assert (out / "training_curve.png").stat().st_size > 0
    assert {"config.json", "adapter_config.json"} & {p.name for p in (out / "final_model").iterdir()}
    assert (out / "final_model" / "tokenizer_config.json").is_file()
    summary = json.loads((out / "eval" / "eval_step_2_summary.json").read_text())
    assert summary["eval/num_episodes"] == 2.0 and summary["eval/failed_rollouts"] == 0.0, summary


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reasoning_gym", "textarena", "verifiers"])
def test_a_scenario_trains_on_the_tiny_model(name: str, tmp_path: Path, model_dir: Path) -> None:
    _train_briefly(name, tmp_path / "out", model_dir)
    _check_run_outputs(tmp_path / "out")
    assert (tmp_path / "out" / "eval" / "eval_step_-1_summary.json").is_file()  # each warm-starts: before SFT


@pytest.mark.slow
def test_the_tool_agent_trains_against_ludics_server(tmp_path: Path, model_dir: Path) -> None:
    from ludic.testing.server_process import start_server, stop_server

    proc, url = start_server(model_dir, "--tool-parser", "hermes")
    try:
        _train_briefly("tool_agent", tmp_path / "out", model_dir, "--set", f"inference.server_url={url}")
    finally:
        stop_server(proc)
    _check_run_outputs(tmp_path / "out")  # the program's episodes did not fail
    prompts = [json.loads(x)["prompt"] for x in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()]
    assert all('"name": "calculator"' in p for p in prompts)  # the tool's schema reached the prompt


@pytest.mark.slow
def test_the_jsonl_run_its_reward_checkpoint_and_loggers(tmp_path: Path, model_dir: Path) -> None:
    out = tmp_path / "out"
    _train_briefly("jsonl_reward", out, model_dir)
    _check_run_outputs(out)
    for episode in map(json.loads, (out / "eval" / "eval_step_2.jsonl").read_text().splitlines()):
        assert episode["total_reward"] in (0.0, 0.5, 1.0)  # antonym_reward's values (exact match gives 0 or 1)
        assert episode["steps"][0]["prev_obs"].startswith("What is the opposite of")
    assert list((out / "tensorboard").rglob("events.out.tfevents.*"))
    checkpoint = out / "checkpoints" / "step_000002"
    assert (checkpoint / "config.json").is_file()
    code, stdout, err = _cli("eval", str(WALK / "jsonl_reward" / "run.toml"), "--model", str(checkpoint),
                             "--output-dir", str(tmp_path / "eval"), "--set", "eval.num_episodes=2")  # fmt: skip
    assert code == 0, err
    stats = json.loads(stdout[stdout.index("{"):])
    assert stats["eval/num_episodes"] == 2.0 and stats["eval/failed_rollouts"] == 0.0


@pytest.mark.slow
def test_the_lora_run_exports_a_plain_model(tmp_path: Path, model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    _train_briefly("jsonl_lora", out, model_dir)
    _check_run_outputs(out)
    assert (out / "checkpoints" / "step_000002" / "adapter_config.json").is_file()  # the adapter alone
    code, stdout, err = _cli("export", str(out), str(tmp_path / "merged"))
    assert code == 0 and re.search(r"wrote .*merged", stdout), err
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name, _ in model.named_parameters())
    code, _, err = _cli("eval", str(WALK / "jsonl_lora" / "run.toml"), "--model", str(tmp_path / "merged"),
                        "--output-dir", str(tmp_path / "eval"), "--set", "eval.num_episodes=2")  # fmt: skip
    assert code == 0, err


def test_the_dry_run_checks_a_prepared_catalogue_model_itself(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[model] path = "smollm2-135m-instruct"`` (a catalogue name, as every config here): once pulled, the dry
    run checks against its folder. It asked the Hugging Face hub for the name instead (retrying for ~40 s
    offline), found nothing, and passed LoRA targets and prompt lengths unchecked."""
    import shutil

    from ludic.models.cache import MARKER

    monkeypatch.setenv("LUDIC_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    prepared = shutil.copytree(model_dir, tmp_path / "models" / "smollm2-135m-instruct")
    (prepared / MARKER).write_text("{}")
    code, _, err = _cli("train", str(WALK / "jsonl_lora" / "run.toml"), "--dry-run", "--output-dir", str(tmp_path),
                        "--set", 'lora.targets=["qkv_proj"]')  # fmt: skip
    assert code == 2 and "'qkv_proj' names no module" in err and "q_proj" in err, err
    code, _, err = _cli("train", str(WALK / "jsonl_reward" / "run.toml"), "--dry-run", "--output-dir", str(tmp_path),
                        "--set", "trainer.max_seq_len=8")  # fmt: skip
    assert code == 2 and "max_seq_len" in err, err
