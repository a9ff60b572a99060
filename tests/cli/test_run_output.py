"""``ludic train`` as a person follows it with stdout not a terminal (piped, or under pytest): SFT progress
lines, then a line per step with elapsed time, s/step, ETA and the held-out evaluation from before
training; the libraries' loading bars only when ``[logging] progress_bars = true``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ludic.cli import main

from .run_configs import write_qa_run_config

pytestmark = pytest.mark.integration


@pytest.fixture
def bars_restored() -> Iterator[None]:
    import huggingface_hub.utils as hub
    import transformers.utils.logging as hf_logging

    yield
    hf_logging.enable_progress_bar()
    hub.enable_progress_bars()


def test_plain_progress_lines_and_quiet_loading_bars(
    tmp_path: Path, model_dir: Path, capfd: pytest.CaptureFixture[str], bars_restored: None
) -> None:
    train, test, demos = tmp_path / "train.jsonl", tmp_path / "test.jsonl", tmp_path / "demos.jsonl"
    train.write_text("".join(json.dumps({"question": f"say {c}", "answer": "zz"}) + "\n" for c in "ab"))
    test.write_text(json.dumps({"question": "say y", "answer": "zz"}) + "\n")
    demos.write_text(json.dumps({"prompt": "say a", "answer": "zz"}) + "\n")
    tables = f'[trainer]\nmax_seq_len = 128\n[sft]\nsteps = 2\nbatch_size = 1\ndemonstrations = "{demos}"\n'
    config = write_qa_run_config(tmp_path / "run.toml", model_dir, train=train, test=test, steps=2, max_tokens=3,
                                 tables=tables)  # fmt: skip
    config.write_text(config.read_text().replace("rich = false", "rich = true"))  # asked, but not a terminal
    assert main(["train", str(config)]) == 0
    out, err = capfd.readouterr()
    lines = out.splitlines()
    sft = [line for line in lines if line.startswith("SFT step")]
    assert [line.split("  ")[0] for line in sft] == ["SFT step 1/2", "SFT step 2/2"]
    assert all(" loss " in line and "elapsed" in line for line in sft)
    steps = [line for line in lines if line.startswith("[ludic] step")]
    assert [line.split(" | ")[0] for line in steps] == ["[ludic] step 1/2", "[ludic] step 2/2"]
    assert "held-out " in steps[0] and "(step 0)" in steps[0]  # the evaluation after the SFT, before RL
    assert all("s/step" in line and "ETA" in line and "elapsed" in line for line in steps)
    assert "Loading weights" not in err and "Writing model shards" not in err
    assert (tmp_path / "out" / "training_curve.png").is_file()

    assert main(["train", str(config), "--fresh", "--set", "logging.progress_bars=true"]) == 0
    assert "Loading weights" in capfd.readouterr().err  # asked for: shown
