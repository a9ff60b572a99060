"""``[sft] from_env = true`` on a verifiers config (examples/ecosystem/verifiers_echo.toml): the taskset's
reference answers are the demonstrations; ``--dry-run`` checks them and a run takes one SFT step."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.cli import main

pytest.importorskip("verifiers.v1")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ecosystem"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ludic.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _config(tmp_path: Path, tiny_model: Path, sft: str) -> Path:
    text = (EXAMPLES / "verifiers_echo.toml").read_text()
    for old, new in [
        ("steps = 40", "steps = 1"),
        ('path = "runs/tiny_model"', f'path = "{tiny_model}"'),
        ('output_dir = "runs/ecosystem/verifiers_echo"', f'output_dir = "{tmp_path / "out"}"\nrich = false'),
        ("prompts_per_step = 4\ngroup_size = 8", "prompts_per_step = 1\ngroup_size = 2"),
        ("num_episodes = 16", "num_episodes = 2"),
        ('[harness]\nname = "plain"', f'[sft]\n{sft}\n\n[harness]\nname = "plain"'),
    ]:
        assert old in text, f"the example no longer holds {old!r}"
        text = text.replace(old, new)
    path = tmp_path / "verifiers_sft.toml"
    path.write_text(text)
    return path


def test_sft_from_a_verifiers_taskset_runs_one_step(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))  # taskset = "echo_taskset" is imported by its id
    config = _config(tmp_path, tiny_model, "from_env = true\nsteps = 1\nbatch_size = 2")
    assert main(["train", str(config), "--dry-run"]) == 0  # was: "provides no demonstrations"
    assert main(["train", str(config)]) == 0
    assert "SFT warm start, 1 steps of 2 from 2 demonstrations" in capsys.readouterr().out


def test_a_taskset_without_answers_is_refused_by_the_dry_run(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    config = _config(tmp_path, tiny_model, "from_env = true\nsteps = 1")
    config.write_text(
        config.read_text().replace(
            "held_out_fraction = 0.25", 'held_out_fraction = 0.25, answer_field = "gold"'
        )
    )
    assert main(["train", str(config), "--dry-run"]) == 2
    assert "no task of EchoData carries a reference answer in 'gold'" in capsys.readouterr().err
