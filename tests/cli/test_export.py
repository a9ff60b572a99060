"""``ludic export``: a full fine-tuning run's checkpoint as a plain transformers folder; which folder a run
gives; OUT that exists and is not empty refused untouched; clear errors for what cannot be exported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ludic.cli import main

from .run_configs import write_run_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step full fine-tuning run (checkpoints at steps 1 and 2, then final_model); returns its folder."""
    from ludic.testing import build_tiny_model

    folder = tmp_path_factory.mktemp("full")
    model = build_tiny_model(folder / "model", seed=0)
    demos = folder / "demos.jsonl"
    demos.write_text("".join(json.dumps({"prompt": f"Repeat {c}", "answer": c * 2}) + "\n" for c in "ab"))
    tables = f'[checkpoint]\nevery_n_steps = 1\n[sft]\nsteps = 1\nbatch_size = 2\nlr = 1e-2\ndemonstrations = "{demos}"\n'
    assert main(["train", str(write_run_config(folder, model, steps=2, eval_episodes=1, tables=tables))]) == 0
    return folder


def _logits(path: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 80, 90, 100, 2, 1, 70, 71]])
    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(path).eval()(ids).logits


def test_full_checkpoint_exports_as_a_plain_model(full_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "plain"
    out.mkdir()  # an empty folder may be the target
    checkpoint = full_run / "out" / "checkpoints" / "step_000002"
    assert main(["export", str(full_run / "out"), str(out)]) == 0  # the run folder: its latest checkpoint
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= names
    assert not names & {"optimizer.pt", "rng_state.pt", "trainer_state.json"}
    exported, saved = load_file(out / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    assert exported.keys() == saved.keys() and all(torch.equal(exported[k], saved[k]) for k in saved)
    torch.testing.assert_close(_logits(out), _logits(checkpoint), atol=0, rtol=0)
    assert not torch.equal(
        saved["model.embed_tokens.weight"],
        load_file(full_run / "model" / "model.safetensors")["model.embed_tokens.weight"],
    )


def test_which_folder_a_source_names(full_run: Path, tmp_path: Path) -> None:
    from ludic.cli.export import find_model_folder

    checkpoints = full_run / "out" / "checkpoints"
    assert find_model_folder(full_run / "out") == checkpoints / "step_000002"
    assert find_model_folder(checkpoints) == checkpoints / "step_000002"
    assert find_model_folder(checkpoints / "step_000001") == checkpoints / "step_000001"
    no_checkpoints = tmp_path / "run"
    shutil.copytree(full_run / "out" / "final_model", no_checkpoints / "final_model")
    assert find_model_folder(no_checkpoints) == no_checkpoints / "final_model"


def test_out_that_is_not_empty_is_refused_untouched(full_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["export", str(full_run / "out"), str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "not an empty folder" in err
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["export", str(full_run / "out"), str(a_file)]) == 2
    assert a_file.read_text() == "x"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-export")]


def test_sources_that_cannot_be_exported_are_named(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", str(empty), str(tmp_path / "o1")]) == 2
    assert f"{empty} holds no model" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "o2")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": str(tmp_path / "gone")})
    )
    assert main(["export", str(adapter), str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err
    assert "gone" in err and "--base" in err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o3").exists()
