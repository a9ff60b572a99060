"""Checkpoints: round trip, atomic writes, pruning, RNG restore, refusal to save NaN weights."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from tests.training.onpolicy import tiny_model

from ludic.training.checkpoint._files import step_dirname
from ludic.training.checkpoint.manager import CheckpointManager
from ludic.training.config import CheckpointConfig

from .checkpointing import trained_optimizer


def test_save_then_load_restores_weights_optimizer_and_metadata(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path))
    model = tiny_model(0, layers=1)
    opt = trained_optimizer(model)
    folder = manager.save(model, opt, step=3, metadata={"note": "hi"}, config={"lr": 1e-3})
    assert folder == tmp_path / "step_000003"
    assert {"model.safetensors", "config.json", "optimizer.pt", "trainer_state.json", "rng_state.pt"} <= {
        p.name for p in folder.iterdir()
    }
    assert json.loads((tmp_path / "latest.json").read_text()) == {"step": 3, "path": "step_000003"}

    other = tiny_model(1, layers=1)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-3)
    state = manager.load(other, other_opt)
    assert state["step"] == 3 and state["metadata"] == {"note": "hi"} and state["config"] == {"lr": 1e-3}
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    assert other.lm_head.weight.data_ptr() == other.model.embed_tokens.weight.data_ptr()  # still tied
    saved_exp = opt.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(other_opt.state_dict()["state"][0]["exp_avg"], saved_exp)


def test_load_restores_rng_states(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path))
    torch.manual_seed(5)
    random.seed(5)
    manager.save(tiny_model(0, layers=1), step=1)
    expected = (torch.rand(3), random.random())
    torch.manual_seed(99)
    random.seed(99)
    manager.load(tiny_model(0, layers=1))
    got = (torch.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]


def test_crash_mid_write_leaves_no_valid_checkpoint_and_latest_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path))
    model = tiny_model(0, layers=1)
    manager.save(model, trained_optimizer(model), step=1)
    latest_before = (tmp_path / "latest.json").read_text()

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)  # the optimizer file is written after the model
    with pytest.raises(OSError, match="disk full"):
        manager.save(model, torch.optim.AdamW(model.parameters()), step=2)
    monkeypatch.undo()

    assert not (tmp_path / "step_000002").exists()
    assert (tmp_path / "latest.json").read_text() == latest_before
    assert [step for step, _ in manager.list_checkpoints()] == [1]
    assert manager.load(tiny_model(1, layers=1))["step"] == 1


def test_leftover_temp_folder_is_ignored_and_cleaned_on_next_save(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path))
    stale = tmp_path / ".tmp-step_000009-deadbeef"
    stale.mkdir(parents=True)
    (stale / "trainer_state.json").write_text("{}")
    assert manager.list_checkpoints() == []
    with pytest.raises(FileNotFoundError, match=r"latest\.json does not exist"):
        manager.load(tiny_model(0, layers=1))
    users = tmp_path / ".tmp-notes"  # a user's own folder with a similar name stays
    users.mkdir()
    (users / "keep.txt").write_text("mine")
    manager.save(tiny_model(0, layers=1), step=1)
    assert not stale.exists()
    assert (users / "keep.txt").read_text() == "mine"


def test_a_step_saved_again_replaces_its_checkpoint_but_never_a_users_folder_of_that_name(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path))
    first = manager.save(tiny_model(0, layers=1), step=2)
    again = manager.save(tiny_model(1, layers=1), step=2)  # a rerun's save of the same step replaces it
    assert again == first and (again / "trainer_state.json").is_file()
    users = tmp_path / step_dirname(3)  # the folder step 3 would be, holding the user's files
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a checkpoint Ludic wrote"):
        manager.save(tiny_model(0, layers=1), step=3)
    assert (users / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")) == []  # its temp folder went


def test_pruning_keeps_the_newest_max_to_keep(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path, every_n_steps=2, max_to_keep=2))
    model = tiny_model(0, layers=1)
    written = [manager.maybe_save(model, step=s) for s in range(1, 7)]
    assert [p.name if p else None for p in written] == [
        None,
        "step_000002",
        None,
        "step_000004",
        None,
        "step_000006",
    ]
    assert [step for step, _ in manager.list_checkpoints()] == [4, 6]
    assert json.loads((tmp_path / "latest.json").read_text())["step"] == 6


def test_refuses_to_checkpoint_nan_weights(tmp_path: Path) -> None:
    model = tiny_model(0, layers=1)
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    with pytest.raises(ValueError, match=r"non-finite weights in \['model.norm.weight'\]"):
        CheckpointManager(CheckpointConfig(output_dir=tmp_path)).save(model, step=1)
    assert not any(tmp_path.iterdir())


def test_plain_module_round_trips_through_safetensors(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path))
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    manager.save(model, step=0)
    other = torch.nn.Linear(3, 2)
    manager.load(other, step=0)
    assert torch.equal(model.weight, other.weight) and torch.equal(model.bias, other.bias)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_n_steps": -1}, "every_n_steps must be an int >= 0"),
        ({"max_to_keep": 0}, "max_to_keep must be None"),
    ],
)
def test_checkpoint_config_rejects_bad_values(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CheckpointConfig(output_dir=tmp_path, **kwargs)


def test_lora_adapter_round_trips(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    def lora() -> torch.nn.Module:
        cfg = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False)
        return get_peft_model(tiny_model(0, layers=1), cfg)

    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path))
    model, other = lora(), lora()
    with torch.no_grad():
        for name, p in other.named_parameters():
            if "lora_" in name:
                p.zero_()
    folder = manager.save(model, step=5)
    assert (folder / "adapter_model.safetensors").is_file()
    adapter = {k: v for k, v in model.named_parameters() if "lora_" in k}
    assert any(not torch.equal(v, dict(other.named_parameters())[k]) for k, v in adapter.items())
    manager.load(other)
    loaded = dict(other.named_parameters())
    assert len(adapter) == 2 and all(torch.equal(v, loaded[k]) for k, v in adapter.items())
