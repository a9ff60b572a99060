"""``--fresh`` (and the quickstart) delete only what a Ludic run wrote; anything else is refused, untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.cli import main
from ludic.cli.run_config import plan_start
from ludic.config import load_config
from ludic.testing.run_config import tiny_run_toml
from ludic.training.run_outputs import OutputsInTheWay, claim_outputs


def _cfg(tmp_path: Path, checkpoint_dir: Path) -> object:
    text = tiny_run_toml(tmp_path / "no-model-needed", steps=2, tables=f"""
[checkpoint]
every_n_steps = 1
output_dir = "{checkpoint_dir}"
[logging]
output_dir = "{tmp_path / "out"}"
rich = false
plot = false
""")
    (tmp_path / "run.toml").write_text(text)
    return load_config(tmp_path / "run.toml")


def _earlier_run(cfg: object, tmp_path: Path, ckpt: Path) -> None:
    """What a finished run leaves: claimed outputs, step folders and latest.json."""
    from ludic.cli.run_config import output_paths

    plan_start(cfg, fresh=True)  # claims the outputs, as every run does before it writes any
    out = tmp_path / "out"
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "eval").mkdir()
    (out / "eval" / "step_1.json").write_text("{}")
    for step in (1, 2):
        (ckpt / f"step_00000{step}").mkdir(parents=True)
        (ckpt / f"step_00000{step}" / "trainer_state.json").write_text(f'{{"step": {step}}}')
    (ckpt / "latest.json").write_text('{"step": 2, "path": "step_000002"}')
    assert output_paths(cfg)


def test_fresh_cleans_an_earlier_runs_outputs_and_keeps_user_files(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpts"
    cfg = _cfg(tmp_path, ckpt)
    _earlier_run(cfg, tmp_path, ckpt)
    (ckpt / "my_notes.txt").write_text("keep me")
    (ckpt / "best_model").mkdir()
    (tmp_path / "out" / "my_analysis.ipynb").write_text("{}")

    assert plan_start(cfg, fresh=True) is False
    assert sorted(p.name for p in ckpt.iterdir()) == ["best_model", "my_notes.txt"]
    assert (ckpt / "my_notes.txt").read_text() == "keep me"
    assert not (tmp_path / "out" / "metrics.jsonl").exists() and not (tmp_path / "out" / "eval").exists()
    assert (tmp_path / "out" / "my_analysis.ipynb").exists()


def test_fresh_refuses_a_regular_file_at_the_checkpoint_path_and_deletes_nothing(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpts"
    cfg = _cfg(tmp_path, ckpt)
    claim_outputs([tmp_path / "out" / "metrics.jsonl"], tmp_path / "out")
    (tmp_path / "out" / "metrics.jsonl").write_text('{"step": 1}\n')
    ckpt.write_text("my precious file")
    with pytest.raises(OutputsInTheWay, match=f"{ckpt} is a file, not a checkpoint folder"):
        plan_start(cfg, fresh=True)
    assert ckpt.read_text() == "my precious file"
    assert (tmp_path / "out" / "metrics.jsonl").exists()  # all or nothing: the claimed file stays too


def test_fresh_refuses_unclaimed_outputs_saying_what_is_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg_path = tmp_path / "run.toml"
    _cfg(tmp_path, tmp_path / "ckpts")
    (tmp_path / "out" / "eval").mkdir(parents=True)
    (tmp_path / "out" / "eval" / "mine.csv").write_text("1,2")
    assert main(["train", str(cfg_path), "--fresh"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'out' / 'eval'} (folder) was not written by a Ludic run" in err
    assert (tmp_path / "out" / "eval" / "mine.csv").read_text() == "1,2"


def test_quickstart_refuses_to_delete_a_users_eval_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "qs"
    (out / "eval").mkdir(parents=True)
    (out / "eval" / "mine.txt").write_text("mine")
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "mine.txt").write_text("mine too")
    assert main(["quickstart", "--steps", "1", "--output-dir", str(out), "--no-live"]) == 2
    assert "(folder) was not written by a Ludic run" in capsys.readouterr().err
    assert (out / "eval" / "mine.txt").read_text() == "mine"
    assert (out / "checkpoints" / "mine.txt").read_text() == "mine too"
