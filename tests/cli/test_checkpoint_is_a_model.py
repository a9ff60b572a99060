"""A checkpoint folder is a whole model: ``ludic eval --model <checkpoint>`` plays episodes from it (its
tokenizer is saved with it); a model folder with no tokenizer is refused before anything loads, naming
``[model].tokenizer``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ludic.cli import main

from .run_configs import write_run_config

pytestmark = pytest.mark.integration


def test_eval_runs_a_checkpoint_and_the_final_model(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_run_config(tmp_path, model_dir, steps=1, eval_episodes=2,
                              tables="[checkpoint]\nevery_n_steps = 1\n")  # fmt: skip
    assert main(["train", str(config)]) == 0
    checkpoint = tmp_path / "out" / "checkpoints" / "step_000001"
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(checkpoint).chat_template  # what every episode failed without
    for folder in (checkpoint, tmp_path / "out" / "final_model"):
        capsys.readouterr()
        assert main(["eval", str(config), "--model", str(folder)]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert stats["eval/num_episodes"] == 2.0
        lines = (tmp_path / "out" / "eval" / "eval_call_1.jsonl").read_text().splitlines()
        assert [len(json.loads(x)["steps"]) for x in lines] == [1, 1]  # each episode played its step


def test_a_model_folder_without_a_tokenizer_is_refused_with_the_key_that_fixes_it(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in model_dir.iterdir():
        if f.is_file() and "token" not in f.name and f.name not in ("vocab.json", "merges.txt"):
            shutil.copy(f, bare / f.name)
    config = write_run_config(tmp_path, model_dir, steps=1, eval_episodes=2)
    assert main(["eval", str(config), "--model", str(bare), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"[model].path: '{bare}' holds no tokenizer" in err and "set [model].tokenizer" in err
    fixed = config.read_text().replace("[model]\n", f'[model]\ntokenizer = "{model_dir}"\n')
    config.write_text(fixed)
    assert main(["eval", str(config), "--model", str(bare)]) == 0
