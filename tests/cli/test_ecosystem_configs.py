"""``ludic train`` on the ecosystem env kinds, tiny and offline: the reasoning-gym example config as
shipped (model, output, sizes and SFT steps swapped for tiny ones) and a JSONL data set; both evaluate on held-out
prompts before step 1 and after the last step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli import main

from .run_configs import write_qa_run_config

pytestmark = pytest.mark.integration
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ecosystem" / "reasoning_gym.toml"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ludic.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _swap(text: str, old: str, new: str) -> str:
    assert old in text, f"the example no longer holds {old!r}"
    return text.replace(old, new)


def _eval_records(out: Path, step: int) -> list[dict]:
    return [json.loads(x) for x in (out / "eval" / f"eval_step_{step}.jsonl").read_text().splitlines()]


def test_reasoning_gym_example_trains_and_reports_before_and_after(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("reasoning_gym")
    text = _swap(EXAMPLE.read_text(), 'path = "runs/tiny_model"', f'path = "{tiny_model}"')
    text = _swap(
        text,
        'output_dir = "runs/ecosystem/reasoning_gym"',
        f'output_dir = "{tmp_path / "out"}"\nrich = false',
    )
    text = _swap(text, "size = 1000, eval_size = 200", "size = 50, eval_size = 20")
    text = _swap(text, "num_episodes = 100", "num_episodes = 4")
    text = _swap(text, "steps = 400 ", "steps = 2 ")  # [sft]
    config = tmp_path / "reasoning_gym.toml"
    config.write_text(text)
    assert main(["train", str(config), "--steps", "2"]) == 0
    out = tmp_path / "out"
    summaries = [json.loads((out / "eval" / f"eval_step_{s}_summary.json").read_text()) for s in (-1, 0, 2)]
    assert [s["eval/num_episodes"] for s in summaries] == [4.0, 4.0, 4.0]
    printed = capsys.readouterr().out
    assert "SFT warm start, 2 steps of 32" in printed
    assert "held-out eval/avg_total_reward before SFT" in printed
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for record in _eval_records(out, 0):
        info = record["steps"][0]["info"]
        assert info["dataset"] == "spell_backward" and 50 <= int(info["question_id"]) < 70  # held-out items


def test_jsonl_dataset_kind_evaluates_on_the_held_out_file(tmp_path: Path, tiny_model: Path) -> None:
    pytest.importorskip("datasets")
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps({"q": f"say {c}", "a": c}) + "\n" for c in "abcd"))
    test.write_text(json.dumps({"q": "say z", "a": "z"}) + "\n")
    config = write_qa_run_config(
        tmp_path / "qa.toml", tiny_model, train=train, test=test, steps=1, max_tokens=2,
        env_kwargs=', question_key = "q", answer_key = "a"', tables="[trainer]\nmax_seq_len = 128\n",
    )  # fmt: skip
    assert main(["train", str(config)]) == 0
    for step in (0, 1):
        assert {r["steps"][0]["prev_obs"] for r in _eval_records(tmp_path / "out", step)} == {"say z"}


def test_a_data_set_without_held_out_rows_fails_the_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("datasets")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    config = tmp_path / "qa.toml"
    config.write_text(f'[model]\npath = "nowhere"\n[env]\nname = "dataset_qa"\nkwargs = {{ path = "{rows}" }}\n'
                      f'[logging]\noutput_dir = "{tmp_path / "out"}"\n')  # fmt: skip
    assert main(["eval", str(config), "--dry-run"]) == 2
    assert "[eval].env_kwargs: building the held-out env 'dataset_qa' with {'split': 'eval'} failed" in (
        capsys.readouterr().err
    )
