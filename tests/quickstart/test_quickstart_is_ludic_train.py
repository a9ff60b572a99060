"""``ludic quickstart`` and ``ludic train`` build their runs through one path.

The quickstart writes its RL phase as a run config (``run_config.yaml``, starting from the model its
SFT warm start saved); ``ludic train`` on that file must train the very same weights and log the
very same losses, so nothing either command adds can drift from the other.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ludic.cli import main

pytestmark = pytest.mark.integration


def _weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def _train_rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/loss" in r]


def test_ludic_train_on_the_quickstarts_config_trains_the_same_weights(tmp_path: Path) -> None:
    qs = tmp_path / "qs"
    argv = ["quickstart", "--steps", "3", "--sft-steps", "20", "--eval-episodes", "2", "--eval-every", "0", "--warmup-steps", "0",
            "--group-size", "4", "--prompts-per-step", "2", "--lr", "1e-3", "--seed", "1",
            "--output-dir", str(qs), "--no-live"]  # fmt: skip
    assert main(argv) == 0
    data = yaml.safe_load((qs / "run_config.yaml").read_text())
    assert data["model"]["path"] == str(qs / "warm_start_model")  # RL started from the SFT'd weights
    assert data["rollout"]["group_size"] == 4 and data["trainer"]["lr"] == 1e-3

    data["logging"]["output_dir"] = str(tmp_path / "train")
    replay = tmp_path / "replay.yaml"
    replay.write_text(yaml.safe_dump(data))
    assert main(["train", str(replay)]) == 0

    train = tmp_path / "train"
    quick_rows, train_rows = _train_rows(qs), _train_rows(train)
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    for key in ("train/loss", "train/avg_total_reward", "train/lr"):
        assert [r[key] for r in train_rows] == [r[key] for r in quick_rows], key
    quick_w, train_w = _weights(qs / "final_model"), _weights(train / "final_model")
    warm_w = _weights(qs / "warm_start_model")
    assert quick_w.keys() == train_w.keys()
    assert all(bool((quick_w[k] == train_w[k]).all()) for k in quick_w)  # bit for bit
    assert any(not bool((quick_w[k] == warm_w[k]).all()) for k in quick_w)  # RL did change them
    assert (train / "checkpoints" / "step_000003").is_dir()  # [checkpoint] came along too


def test_a_model_dir_inside_the_outputs_it_replaces_is_refused(tmp_path: Path) -> None:
    from ludic.quickstart.config import QuickstartConfig
    from ludic.quickstart.run_config import refuse_model_dir_in_outputs, run_config_data, to_run_config

    cfg = QuickstartConfig(output_dir=str(tmp_path / "qs"))
    inside = tmp_path / "qs" / "final_model"  # continuing from the last run's model, in place
    with pytest.raises(ValueError, match=r"lies inside .*final_model, which this run replaces"):
        refuse_model_dir_in_outputs(inside, to_run_config(run_config_data(cfg, inside)))
    outside = tmp_path / "kept_model"
    refuse_model_dir_in_outputs(outside, to_run_config(run_config_data(cfg, outside)))
