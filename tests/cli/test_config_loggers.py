"""``[logging] wandb = {...}`` and ``tensorboard = true`` from a config: both receive every step (read back:
TensorBoard's event file, wandb's offline run); ``--dry-run`` refuses keywords ``wandb.init`` does not take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli import main

from .run_configs import write_run_config

pytestmark = pytest.mark.integration


def test_tensorboard_and_wandb_from_a_config(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb_dir = tmp_path / "wb"
    wandb_dir.mkdir()
    logging = f'[logging.wandb]\nproject = "ludic-test"\nname = "tiny"\nmode = "offline"\ndir = "{wandb_dir}"\n'
    config = write_run_config(tmp_path, model_dir, steps=2, eval_episodes=2)
    config.write_text(config.read_text().replace("rich = false", "rich = false\ntensorboard = true") + logging)
    assert main(["train", str(config)]) == 0
    acc = EventAccumulator(str(tmp_path / "out" / "tensorboard"))
    acc.Reload()
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [
        (r["step"], pytest.approx(r["train/loss"])) for r in rows
    ]
    (run,) = (wandb_dir / "wandb").glob("offline-run-*")
    (log,) = run.glob("run-*.wandb")  # the run's records, which `wandb sync` uploads (protobuf; keys as text)
    records = log.read_bytes()
    assert records.count(b"train/loss") >= len(rows)  # one history record per step (and the summary)
    assert str(tmp_path / "out").encode() in records  # the run config is the wandb run's config

def test_the_dry_run_refuses_what_wandb_init_does_not_take(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_run_config(tmp_path, model_dir, steps=1, eval_episodes=2)
    config.write_text(config.read_text() + '[logging.wandb]\nprojekt = "x"\n')
    assert main(["train", str(config), "--dry-run"]) == 2
    assert "[logging].wandb: ['projekt'] are not wandb.init keywords" in capsys.readouterr().err
