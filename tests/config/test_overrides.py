"""``--set section.key=value`` and ``--output-dir``: applied to the file's data before validation, so a
value is checked (and refused) exactly as the same key written in the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli import main
from ludic.config import ConfigError, load_config

CONFIG = """
steps = 3
[model]
path = "models/tiny"
[env]
name = "letter_repeat"
kwargs = { count = 3 }
[logging]
output_dir = "runs/a"
[checkpoint]
every_n_steps = 2
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(CONFIG)
    return path


def test_values_are_read_as_toml_and_nested_keys_reach_their_table(config: Path) -> None:
    cfg = load_config(config, ["steps=20", "trainer.lr=1e-5", "rollout.sampling.temperature=0.5",
                               "rollout.sampling.stop=['x', 'y']", "model.path=runs/x/final_model",
                               "env.kwargs.letters=\"ab\"", "logging.rich=false"])  # fmt: skip
    assert cfg.steps == 20 and cfg.trainer.lr == 1e-5
    assert cfg.rollout.sampling.temperature == 0.5 and cfg.rollout.sampling.stop == ["x", "y"]
    assert cfg.model.path == "runs/x/final_model"  # a bare word is a string
    assert cfg.env.kwargs == {"count": 3, "letters": "ab"} and cfg.logging.rich is False


def test_a_later_set_wins_and_the_file_is_unchanged(config: Path) -> None:
    assert load_config(config, ["steps=4", "steps=5"]).steps == 5
    assert load_config(config).steps == 3


def test_unknown_keys_and_wrong_types_are_the_files_errors(config: Path) -> None:
    with pytest.raises(ConfigError) as got:
        load_config(config, ["trainer.lrr=1", "steps=many", "rollout.group_siz=2"])
    errors = got.value.errors
    assert any(e.startswith("run.toml: [trainer].lrr: unknown key; known keys:") for e in errors)
    assert "run.toml: steps: expected int, got str 'many'" in errors
    assert any(e.startswith("run.toml: [rollout].group_siz: unknown key") for e in errors)


@pytest.mark.parametrize("bad", ["steps", "=3", "trainer..lr=1", "steps.x=1"])
def test_malformed_sets_are_refused_naming_them(config: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match="--set"):
        load_config(config, [bad])


def test_output_dir_moves_the_checkpoints_that_lay_under_it(config: Path, tmp_path: Path) -> None:
    cfg = load_config(config, output_dir=str(tmp_path / "b"))
    assert cfg.logging.output_dir == str(tmp_path / "b")
    assert cfg.checkpoint is not None and cfg.checkpoint.output_dir == tmp_path / "b" / "checkpoints"
    config.write_text(CONFIG + 'output_dir = "/elsewhere/ckpts"\n')
    assert load_config(config, output_dir="runs/c").checkpoint.output_dir == Path("/elsewhere/ckpts")
    config.write_text(CONFIG + 'output_dir = "runs/a/ck"\n')
    assert load_config(config, output_dir="runs/c").checkpoint.output_dir == Path("runs/c/ck")


def test_cli_flags_reach_the_dry_run(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     model_dir: Path) -> None:  # fmt: skip
    out = tmp_path / "variant"
    argv = ["train", str(config), "--dry-run", "--set", f"model.path={model_dir}", "--set", "rollout.group_size=2",
            "--set", "rollout.prompts_per_step=2", "--output-dir", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["rollout"]["group_size"] == 2 and printed["logging"]["output_dir"] == str(out)
    assert main(["eval", str(config), "--dry-run", "--set", "eval.num_episods=2"]) == 2
    assert "[eval].num_episods: unknown key" in capsys.readouterr().err


def test_the_data_is_not_changed_and_only_the_path_is_copied() -> None:
    from ludic.config.overrides import apply_overrides

    data = {"trainer": {"lr": 1.0}, "env": {"name": "e", "kwargs": {"deep": {"x": 1}}}}
    out = apply_overrides(data, ["trainer.lr=2.0", "env.kwargs.y=3"])
    assert data == {"trainer": {"lr": 1.0}, "env": {"name": "e", "kwargs": {"deep": {"x": 1}}}}
    assert out["trainer"] == {"lr": 2.0} and out["env"]["kwargs"] == {"deep": {"x": 1}, "y": 3}
    assert out["env"]["kwargs"]["deep"] is data["env"]["kwargs"]["deep"]  # off the path: shared, not walked
