"""Config errors are reported before any model loads, each naming the file and key."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from ludic.cli import main

BASE = """
steps = 2
[model]
path = "{model}"
[env]
name = "letter_repeat"
kwargs = { count = 2, letters = "ab" }
[trainer]
max_seq_len = 128
micro_token_budget = 1024
[logging]
output_dir = "{out}"
rich = false
"""


def _run(tmp_path: Path, model: Path | str, text: str, *extra: str) -> tuple[int, str, str]:
    path = tmp_path / "run.toml"
    path.write_text(text.replace("{model}", str(model)).replace("{out}", str(tmp_path / "out")))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train", str(path), *extra])
    return code, out.getvalue(), err.getvalue()


def test_unknown_names_are_all_reported_with_the_known_ones(tmp_path: Path) -> None:
    text = BASE.replace('name = "letter_repeat"', 'name = "letter_repeet"')
    text += '[harness]\nname = "plian"\n[protocol]\nname = "duet"\n[algorithm]\nname = "grpoo"\n'
    code, out, err = _run(tmp_path, "nowhere", text, "--dry-run")
    assert code == 2 and out == ""
    assert "run.toml: [env].name: unknown env 'letter_repeet'; known envs: " in err
    assert "run.toml: [harness].name: unknown harness 'plian'; known harnesses: plain, xml_move" in err
    assert "run.toml: [protocol].name: unknown protocol 'duet'; known protocols: " in err
    assert "openai_program" in err and "single_agent" in err
    assert "run.toml: [algorithm].name: unknown algorithm 'grpoo'; known algorithms: " in err


def test_constructor_keyword_errors_name_the_table(tmp_path: Path) -> None:
    text = BASE.replace("count = 2", "cnt = 2") + '[harness]\nkwargs = { system_promt = "hi" }\n'
    text += '[eval]\nenv_kwargs = { letterz = "xy" }\n'
    code, _, err = _run(tmp_path, "nowhere", text, "--dry-run")
    assert code == 2
    assert (
        "run.toml: [env].kwargs: env 'letter_repeat': got an unexpected keyword argument 'cnt' (it takes:"
        in err
    )
    assert "run.toml: [eval].env_kwargs: env 'letter_repeat': got an unexpected keyword argument" in err
    assert (
        "run.toml: [harness].kwargs: harness 'plain': got an unexpected keyword argument 'system_promt'"
        in err
    )


def test_group_size_that_does_not_fit_the_batch(tmp_path: Path) -> None:
    text = BASE + "[rollout]\ngroup_size = 8\n[algorithm]\nkwargs = { group_size = 3 }\n"
    code, _, err = _run(tmp_path, "nowhere", text, "--dry-run")
    assert code == 2
    assert "run.toml: [algorithm].kwargs.group_size: 3 does not fit the batch" in err


def test_negative_steps_are_refused(tmp_path: Path) -> None:
    code, _, err = _run(tmp_path, "nowhere", BASE, "--dry-run", "--steps", "-3")
    assert code == 2 and "--steps: must be >= 0, got -3" in err
    code, _, err = _run(tmp_path, "nowhere", BASE.replace("steps = 2", "steps = -1"), "--dry-run")
    assert code == 2 and "run.toml: top level: steps must be >= 0, got -1" in err


def test_max_seq_len_that_cuts_every_action_is_refused_before_the_model_loads(
    tmp_path: Path, model_dir: Path
) -> None:
    text = BASE.replace("max_seq_len = 128", "max_seq_len = 8")
    code, out, err = _run(tmp_path, model_dir, text)  # a real run: stops before loading anything
    assert code == 2 and out == ""
    assert "run.toml: [trainer].max_seq_len: 8 leaves no action token: the first prompt of env" in err
    assert not (tmp_path / "out").exists()
    code, _, _ = _run(tmp_path, model_dir, BASE, "--dry-run")
    assert code == 0


def test_a_checkpoint_dir_that_is_a_file_fails_the_dry_run(tmp_path: Path) -> None:
    (tmp_path / "ckpt").write_text("not a directory")
    text = BASE + f'[checkpoint]\noutput_dir = "{tmp_path / "ckpt"}"\nevery_n_steps = 1\n'
    code, out, err = _run(tmp_path, "nowhere", text, "--dry-run")
    assert code == 2 and out == ""
    assert (
        f"run.toml: [checkpoint].output_dir: '{tmp_path / 'ckpt'}' is a file, not a directory; "
        "point it at a directory or move the file"
    ) in err


def test_a_log_dir_that_is_a_file_is_reported_once(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("not a directory")
    code, _, err = _run(tmp_path, "nowhere", BASE + "[checkpoint]\nevery_n_steps = 1\n", "--dry-run")
    assert code == 2
    assert f"run.toml: [logging].output_dir: '{tmp_path / 'out'}' is a file, not a directory" in err
    assert "[checkpoint].output_dir" not in err  # <out>/checkpoints: the same problem, not repeated


def test_an_output_dir_under_a_file_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("")
    text = BASE + f'[checkpoint]\noutput_dir = "{tmp_path / "blocker" / "a" / "ckpt"}"\nevery_n_steps = 1\n'
    code, _, err = _run(tmp_path, "nowhere", text, "--dry-run")
    assert code == 2
    assert (
        f"run.toml: [checkpoint].output_dir: '{tmp_path / 'blocker' / 'a' / 'ckpt'}' cannot be created: "
        f"'{tmp_path / 'blocker'}' is a file, not a directory"
    ) in err


def test_output_dirs_that_do_not_exist_yet_pass_and_are_not_created(tmp_path: Path) -> None:
    text = BASE + f'[checkpoint]\noutput_dir = "{tmp_path / "deep" / "er" / "ckpt"}"\nevery_n_steps = 1\n'
    code, _, err = _run(tmp_path, "nowhere", text, "--dry-run")
    assert code == 0, err
    assert not (tmp_path / "deep").exists() and not (tmp_path / "out").exists()
