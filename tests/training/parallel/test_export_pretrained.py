"""export_pretrained replaces an earlier export but never deletes a user's files."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from ludic.testing import build_tiny_model
from ludic.training.parallel.publish import export_pretrained


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    return AutoModelForCausalLM.from_pretrained(path)


def test_an_export_loads_and_a_second_export_replaces_the_first(model, tmp_path: Path) -> None:
    out = tmp_path / "export"
    assert export_pretrained(model, out) == out
    first = (out / "model.safetensors").stat().st_mtime_ns
    export_pretrained(model, out)
    assert (out / "model.safetensors").stat().st_mtime_ns >= first
    assert AutoModelForCausalLM.from_pretrained(out).config.hidden_size == model.config.hidden_size


def test_a_folder_holding_other_files_is_refused_and_kept(model, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    with pytest.raises(FileExistsError, match=r"notes\.txt.*nothing was deleted"):
        export_pretrained(model, out)
    assert (out / "notes.txt").read_text() == "my notes"
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]  # no temporary folder left behind


def test_a_file_at_the_path_is_refused_and_kept(model, tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.write_text("a file")
    with pytest.raises(FileExistsError, match="not a directory"):
        export_pretrained(model, out)
    assert out.read_text() == "a file"
