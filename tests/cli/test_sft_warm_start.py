"""``[sft]`` in ``ludic train``: checked by the dry run, trained before RL with held-out evaluations before
and after it, the engine's policy versions restarted, never redone by a resumed run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ludic.cli import main
from ludic.config import parse_config

from .run_configs import write_qa_run_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ludic.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _write_rows(tmp_path: Path) -> tuple[Path, Path, Path]:
    train, test, demos = tmp_path / "train.jsonl", tmp_path / "test.jsonl", tmp_path / "demos.jsonl"
    train.write_text("".join(json.dumps({"question": f"say {c}", "answer": "zz"}) + "\n" for c in "abcd"))
    test.write_text(json.dumps({"question": "say y", "answer": "zz"}) + "\n")
    lines = [{"prompt": "say a", "answer": "zz"}, {"messages": [{"role": "user", "content": "say b"},
                                                             {"role": "assistant", "content": "zz"}]}]  # fmt: skip
    demos.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return train, test, demos


def _config(tmp_path: Path, model: Path, sft: str, *, steps: int = 1, extra: str = "") -> Path:
    train, test, _ = _write_rows(tmp_path)
    tables = f"[trainer]\nmax_seq_len = 128\nlr = 1e-6\n[sft]\n{sft}\n{extra}"
    return write_qa_run_config(tmp_path / "run.toml", model, train=train, test=test, steps=steps, max_tokens=3,
                               plot=False, tables=tables)  # fmt: skip


def _summary(out: Path, step: int) -> dict:
    return json.loads((out / "eval" / f"eval_step_{step}_summary.json").read_text())


def _steps(out: Path, step: int) -> list[dict]:
    lines = (out / "eval" / f"eval_step_{step}.jsonl").read_text().splitlines()
    return [json.loads(x)["steps"][0] for x in lines]


def _versions(out: Path, step: int) -> set:
    return {s["info"].get("policy_version") for s in _steps(out, step)}


def _actions(out: Path, step: int) -> list[str]:
    return [s["action"] for s in _steps(out, step)]


def test_sft_from_a_file_runs_between_the_before_and_start_of_rl_evaluations(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    demos = tmp_path / "demos.jsonl"
    config = _config(
        tmp_path, tiny_model, f'steps = 12\nbatch_size = 2\nlr = 1e-2\ndemonstrations = "{demos}"'
    )
    assert main(["train", str(config)]) == 0
    out, printed = tmp_path / "out", capsys.readouterr().out
    assert not any(a.startswith("z") for a in _actions(out, -1))  # the untrained model never says "zz"
    assert all(a.startswith("zz") for a in _actions(out, 0))  # after SFT it does, on the held-out question
    assert _versions(out, 0) == {0}  # restart_versions(0): the 12 SFT publishes left no version behind
    assert "SFT warm start, 12 steps of 2 from 2 demonstrations" in printed
    before, start = (f"{_summary(out, s)['eval/avg_total_reward']:.3f}" for s in (-1, 0))
    assert f"before SFT {before}, after SFT (start of RL) {start}, after " in printed


def test_a_resumed_run_does_not_redo_the_sft(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sft = "steps = 2\nbatch_size = 2\nfrom_env = true"
    config = _config(tmp_path, tiny_model, sft, extra="[checkpoint]\nevery_n_steps = 1\n")
    assert main(["train", str(config)]) == 0
    first = capsys.readouterr().out
    stamps = [(tmp_path / "out" / "eval" / f"eval_step_{s}_summary.json").stat().st_mtime_ns for s in (-1, 0)]
    assert main(["train", str(config), "--steps", "2"]) == 0
    again = capsys.readouterr().out
    assert "SFT warm start" in first and "SFT warm start" not in again and "resuming at step 1" in again
    assert [
        (tmp_path / "out" / "eval" / f"eval_step_{s}_summary.json").stat().st_mtime_ns for s in (-1, 0)
    ] == stamps
    before = first.split("before SFT ")[1].split(",")[0]
    assert f"before SFT {before}, after SFT (start of RL)" in again  # read back from the summaries


@pytest.mark.parametrize(
    ("sft", "demo_lines", "message"),
    [
        (
            'steps = 1\ndemonstrations = "{demos}"',
            ['{"prompt": "q", "answer": "a"}', '{"prompt": "q"}'],
            "[sft].demonstrations: ValueError: {demos}:2: no answer field",
        ),
        (
            'steps = 1\ndemonstrations = "{demos}"',
            ['{"messages": [{"role": "user", "content": "q"}]}'],
            "{demos}:1: messages must be a list of at least 2 messages",
        ),
        ('steps = 1\ndemonstrations = "{demos}"', ["[1, 2]"], "{demos}:1: expected a JSON object per line"),
        ('steps = 1\ndemonstrations = "{demos}.missing"', [], "no such demonstrations file"),
        ("steps = 1", [], "[sft]: give demonstrations = 'file.jsonl' or from_env = true (exactly one)"),
        ("steps = 0\nfrom_env = true", [], "[sft]: steps must be >= 1, got 0"),
        ('steps = 1\nfrom_env = true\nlr = "x"', [], "[sft].lr: expected float"),
    ],
)
def test_the_dry_run_names_what_is_wrong_with_sft(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sft: str, demo_lines: list[str], message: str
) -> None:
    pytest.importorskip("datasets")
    demos = tmp_path / "bad.jsonl"
    demos.write_text("".join(line + "\n" for line in demo_lines))
    config = _config(tmp_path, tmp_path / "no-model", sft.replace("{demos}", str(demos)))
    assert main(["train", str(config), "--dry-run"]) == 2
    assert message.replace("{demos}", str(demos)) in capsys.readouterr().err


def test_an_env_without_demonstrations_fails_the_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(f'[model]\npath = "m"\n[env]\nname = "letter_repeat"\n[logging]\noutput_dir = "{tmp_path}"\n'
                      "[sft]\nsteps = 1\nfrom_env = true\n")  # fmt: skip
    assert main(["train", str(config), "--dry-run"]) == 2
    assert "env 'letter_repeat' (LetterRepeatEnv) provides no demonstrations" in capsys.readouterr().err


def test_demonstration_prompts_are_the_ids_the_agent_sends(tmp_path: Path, tiny_model: Path) -> None:
    """The SFT item's prompt part equals the prompt ids of a real episode on the same row (system prompt
    from the harness, chat template from the tokenizer)."""
    pytest.importorskip("datasets")
    from ludic.cli.demonstrations import demonstration_items
    from ludic.cli.runtime import make_client, make_engine, make_requests

    train, _, _ = _write_rows(tmp_path)
    cfg = parse_config({
        "model": {"path": str(tiny_model)},
        "env": {"name": "dataset_qa", "kwargs": {"path": str(train)}},
        "harness": {"name": "plain", "kwargs": {"system_prompt": "Be brief."}},
        "sft": {"steps": 1, "batch_size": 4, "from_env": True},
    })  # fmt: skip
    client = make_client(cfg)
    items = demonstration_items(cfg, client.tokenizer)
    sampling = cfg.eval.sampling.to_sampling()
    engine = make_engine(cfg, client, sampling)
    rollouts = asyncio.run(engine.generate_rollouts(
        requests=make_requests(cfg, first_seed=0, n=4, sampling=sampling), max_steps=1))  # fmt: skip
    sent = {tuple(r.steps[0].trace.prompt_token_ids) for r in rollouts}
    assert {tuple(i.input_ids[: i.meta["prompt_length"]]) for i in items} == sent
    assert all(i.action_mask[: i.meta["prompt_length"]] == [0] * i.meta["prompt_length"] for i in items)
