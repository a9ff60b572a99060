"""``ludic models`` and ``[model] path`` given as a GGUF file or a catalogue name, through the CLI entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli import main
from ludic.testing.run_config import tiny_run_toml


def _config(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(tiny_run_toml(model, steps=1, tables=f'[logging]\noutput_dir = "{tmp_path / "out"}"\n'))
    return path


def test_models_list_names_the_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct" in out and "134.5M" in out


def test_a_truncated_gguf_path_fails_the_dry_run_by_name(
    smollm2_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = tmp_path / "cut.gguf"
    with smollm2_gguf.open("rb") as src:
        cut.write_bytes(src.read(4 << 20))
    assert main(["train", str(_config(tmp_path, str(cut))), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "[model].path" in err and "cut.gguf" in err and "truncated" in err


def test_models_prepare_names_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04")
    assert main(["models", "prepare", str(bad), "--cache-dir", str(tmp_path / "c")]) == 2
    assert "not a GGUF file" in capsys.readouterr().err


def test_a_catalogue_name_as_model_path_runs_the_prepared_model(
    smollm2_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dry run accepts the name (and checks with the pulled folder once there is one); ``ludic eval`` resolves it to the pulled folder and plays episodes."""
    config = _config(tmp_path, "smollm2-135m-instruct")
    assert main(["train", str(config), "--dry-run"]) == 0
    from ludic.models import prepared_path
    from ludic.models.cache import is_prepared

    folder = prepared_path("smollm2-135m-instruct")  # a dry run reads an already pulled model's own folder
    shown = str(folder) if is_prepared(folder) else "smollm2-135m-instruct"
    assert json.loads(capsys.readouterr().out)["model"]["path"] == shown
    args = ["eval", str(config), "--set", "eval.num_episodes=2", "--set", "eval.sampling.max_tokens=2"]
    assert main(args) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["eval/num_episodes"] == 2.0 and stats["eval/failed_rollouts"] == 0.0
    episode = json.loads((tmp_path / "out" / "eval" / "eval_call_1.jsonl").read_text().splitlines()[0])
    step = episode["steps"][0]
    # greedy: [eval].sampling stays greedy when --set gives only its max_tokens
    assert step["info"]["sampling_temperature"] == 0.0 and step["info"]["finish_reason"] == "length"
    assert step["action"].strip() and step["action"].isprintable()  # the real model writes text
