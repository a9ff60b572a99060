"""Checkpoints that cannot run code, load atomically, read HF ``.bin`` weights and prune safely."""

from __future__ import annotations

import json
import pathlib
import re
from pathlib import Path

import pytest
import torch
from tests.training.onpolicy import tiny_model

from ludic.training.checkpoint.manager import CheckpointLoadError, CheckpointManager
from ludic.training.config import CheckpointConfig

from .checkpointing import assert_load_refused, assert_unchanged, snapshot, trained_optimizer


class _Payload:
    """Unpickling this would create ``path`` (a stand-in for any code a planted file could run)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (pathlib.Path.touch, (self.path,))


@pytest.mark.parametrize("planted", ["optimizer.pt", "rng_state.pt", "scheduler.pt"])
def test_planted_pickle_is_refused_and_runs_nothing(tmp_path: Path, planted: str) -> None:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path / "ckpt"))
    model = tiny_model(0, layers=1)
    opt = trained_optimizer(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    folder = manager.save(model, opt, step=1, scheduler=sched)
    marker = tmp_path / "pwned"
    torch.save({"state": {}, "param_groups": [], "evil": _Payload(marker)}, folder / planted)

    other = tiny_model(1, layers=1)
    other_opt = trained_optimizer(other)
    snap = snapshot(other, other_opt)
    with pytest.raises(CheckpointLoadError) as info:
        manager.load(other, other_opt, scheduler=torch.optim.lr_scheduler.LambdaLR(other_opt, lambda s: 1.0))
    assert str(folder / planted) in str(info.value)
    assert "refused to load" in str(info.value) and "could run code" in str(info.value)
    assert not marker.exists()
    assert_unchanged(other, other_opt, snap)


def test_corrupt_weights_leave_model_and_optimizer_untouched(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path))
    model = tiny_model(0, layers=1)
    folder = manager.save(model, trained_optimizer(model), step=1)
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    assert_load_refused(manager, re.escape(str(folder / "model.safetensors")))


def test_optimizer_state_of_another_model_is_refused_before_weights_change(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path))
    model = tiny_model(0, layers=1)
    folder = manager.save(model, trained_optimizer(model), step=1)
    wide = tiny_model(0, layers=1, hidden=48)
    torch.save(trained_optimizer(wide).state_dict(), folder / "optimizer.pt")
    assert_load_refused(manager, r"optimizer\.pt: state 'exp_avg' of parameter 0 has shape")


def test_fallback_loads_the_previous_complete_checkpoint(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path))
    model = tiny_model(0, layers=1)
    opt = trained_optimizer(model)
    manager.save(model, opt, step=1)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    broken = manager.save(model, opt, step=2)
    (broken / "optimizer.pt").write_bytes(b"not a torch file")

    with pytest.raises(CheckpointLoadError, match=r"optimizer\.pt: cannot be read"):
        manager.load(tiny_model(1, layers=1), trained_optimizer(tiny_model(1, layers=1)))
    other = tiny_model(1, layers=1)
    state = manager.load(other, trained_optimizer(other), fallback=True)
    assert state["step"] == 1
    for key, value in other.state_dict().items():
        assert torch.equal(value, expected[key]), key


def _write_state(folder: Path, step: int) -> None:
    (folder / "trainer_state.json").write_text(json.dumps({"step": step, "time": 0.0}))


def test_loads_pytorch_model_bin(tmp_path: Path) -> None:
    model = tiny_model(0, layers=1)
    folder = tmp_path / "step_000007"
    folder.mkdir()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    _write_state(folder, 7)
    other = tiny_model(1, layers=1)
    state = CheckpointManager(CheckpointConfig(output_dir=tmp_path)).load(other, step=7)
    assert state["step"] == 7
    for key, value in model.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key


def test_loads_sharded_bin_through_its_index(tmp_path: Path) -> None:
    model = tiny_model(0, layers=1)
    folder = tmp_path / "old"
    folder.mkdir()
    keys = list(model.state_dict())
    shards = {"pytorch_model-00001-of-00002.bin": keys[::2], "pytorch_model-00002-of-00002.bin": keys[1::2]}
    weight_map = {}
    for name, shard_keys in shards.items():
        torch.save({k: model.state_dict()[k].clone() for k in shard_keys}, folder / name)
        weight_map.update(dict.fromkeys(shard_keys, name))
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "pytorch_model-99999.bin").write_bytes(b"not listed in the index: never read")
    _write_state(folder, 3)
    other = tiny_model(1, layers=1)
    CheckpointManager(CheckpointConfig(output_dir=tmp_path)).load(other, path=folder)
    for key, value in model.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key


def test_pruning_never_deletes_the_new_or_latest_checkpoint_whatever_old_runs_left(tmp_path: Path) -> None:
    model = tiny_model(0, layers=1)
    CheckpointManager(CheckpointConfig(output_dir=tmp_path)).save(model, step=500)  # an older, longer run
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path, max_to_keep=1))
    first = manager.save(model, step=1)
    assert first.is_dir() and manager.latest_path() == first
    assert [s for s, _ in manager.list_checkpoints()] == [1]
    second = manager.save(model, step=2)
    assert [s for s, _ in manager.list_checkpoints()] == [2] and manager.latest_path() == second


def test_pruning_keeps_the_most_recently_written(tmp_path: Path) -> None:
    model = tiny_model(0, layers=1)
    CheckpointManager(CheckpointConfig(output_dir=tmp_path)).save(model, step=500)
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path, max_to_keep=2))
    for step in (1, 2, 3):
        manager.save(model, step=step)
    assert [s for s, _ in manager.list_checkpoints()] == [2, 3]
