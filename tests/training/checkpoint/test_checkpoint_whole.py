"""A checkpoint load checks the whole: shards disjoint and covering each tensor, every value finite, the
optimizer's hyper-parameters typed and in range, no state for an unknown parameter; all one error type.

The sharded (DCP safetensors) folders are real: written by ``save_shards`` in one process, then forged the way
an attacker would (shard files rewritten with other offsets, ``shards.json`` edited); ``check_shards`` and
``read_shards`` are the functions every rank of ``DistributedCheckpointer`` runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tests.training.onpolicy import tiny_model

from ludic.training.checkpoint.manager import CheckpointLoadError, CheckpointManager
from ludic.training.config import CheckpointConfig
from ludic.training.parallel._sharded_io import (
    MANIFEST,
    check_shards,
    read_shards,
    save_shards,
    write_manifest,
)

from .checkpointing import assert_load_refused, trained_optimizer

PLAIN = {"state": {}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.0,
                                        "amsgrad": False, "foreach": None, "params": ["w"]}]}  # fmt: skip


def expected() -> dict[str, torch.Tensor]:
    return {"model/w": torch.arange(128, dtype=torch.float32), "optim/w/exp_avg": torch.ones(128)}


def sharded(folder: Path) -> Path:
    """A real one-rank sharded checkpoint of ``expected()`` with ``PLAIN`` optimizer parts."""
    folder.mkdir()
    tensors = expected()
    save_shards(folder, tensors)
    write_manifest(folder, tensors, json.loads(json.dumps(PLAIN)))
    return folder


def reshard(folder: Path, pieces: list[tuple[int, int]], *, fill: float | None = None) -> None:
    """Rewrite ``model/w`` as one shard file per ``(offset, size)`` piece (as N ranks would have saved it)."""
    for p in folder.glob("*.safetensors"):
        p.unlink()
    w, avg = expected()["model/w"], expected()["optim/w/exp_avg"]
    for i, (offset, size) in enumerate(pieces):
        part = {"model/w": w[offset : offset + size].clone() if fill is None else torch.full((size,), fill)}
        info = {"model/w": {"saved_offsets": [offset]}}
        if i == 0:
            part["optim/w/exp_avg"], info["optim/w/exp_avg"] = avg.clone(), {"saved_offsets": [0]}
        name = f"shard-{i + 1:05d}-model-00001-of-00001.safetensors"
        save_file(part, str(folder / name), metadata={"DCP_SHARDING_INFO": json.dumps(info), "DCP_VERSION": "1.0",
                                                       "format": "pt"})  # fmt: skip
    edit(folder, lambda m: m.update(files={p.name: p.stat().st_size for p in sorted(folder.glob("*.safetensors"))}))


def edit(folder: Path, change) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_a_well_formed_sharded_checkpoint_loads_exactly(tmp_path: Path) -> None:
    folder = sharded(tmp_path / "ok")
    reshard(folder, [(0, 64), (64, 32), (96, 32)])
    check_shards(folder, expected(), PLAIN)
    loaded = read_shards(folder, expected())
    assert all(torch.equal(loaded[k], v) for k, v in expected().items())


def test_overlapping_shards_that_leave_a_gap_are_refused_though_their_sizes_add_up(tmp_path: Path) -> None:
    folder = sharded(tmp_path / "gap")
    reshard(folder, [(0, 64), (32, 32), (96, 32)])  # 64 + 32 + 32 = 128, and [64, 96) is in no shard
    with pytest.raises(CheckpointLoadError, match=r"shards of model/w overlap"):
        check_shards(folder, expected(), PLAIN)


def test_a_non_finite_shard_value_is_refused_when_read(tmp_path: Path) -> None:
    folder = sharded(tmp_path / "nan")
    reshard(folder, [(0, 64), (64, 64)], fill=float("nan"))
    check_shards(folder, expected(), PLAIN)  # the layout is fine: the values are not
    with pytest.raises(CheckpointLoadError, match=r"model/w holds NaN or inf"):
        read_shards(folder, expected())


@pytest.mark.parametrize(
    ("group", "field"),
    [({"lr": "0.1"}, "lr must be a finite number"), ({"lr": -1000}, r"lr must be in \[0"),
     ({"lr": float("inf")}, "lr must be a finite number"), ({"betas": [5, 5]}, r"betas\[0\] must be in \[0, 1\)"),
     ({"betas": [0.9]}, "betas must be a list of 2"), ({"eps": 0}, "eps must be > 0"),
     ({"weight_decay": -0.1}, "weight_decay must be in"), ({"amsgrad": 1}, "amsgrad must be true/false"),
     ({"foreach": "yes"}, "foreach must be null or a bool"), ({"surprise": 1.0}, r"hyper-parameters \['surprise'\]")],
)  # fmt: skip
def test_sharded_optimizer_hyper_parameters_are_typed_and_in_range(tmp_path: Path, group: dict, field: str) -> None:
    folder = sharded(tmp_path / "opt")
    edit(folder, lambda m: m["optimizer"]["param_groups"][0].update(group))
    with pytest.raises(CheckpointLoadError, match=field):
        check_shards(folder, expected(), PLAIN)


def test_sharded_optimizer_state_for_an_unknown_parameter_is_refused(tmp_path: Path) -> None:
    folder = sharded(tmp_path / "stray")
    edit(folder, lambda m: m["optimizer"]["state"].update({"ghost": {"step": 3}}))
    with pytest.raises(CheckpointLoadError, match=r"state for parameters the optimizer does not have: \['ghost'\]"):
        check_shards(folder, expected(), PLAIN)


@pytest.mark.parametrize("spec", [["F32", [128]], "F32", {"shape": "128", "dtype": "F32"}, {"shape": [-1], "dtype": "F32"},
                                  {"shape": [128], "dtype": 5}])  # fmt: skip
def test_a_malformed_tensor_spec_is_the_modules_own_error(tmp_path: Path, spec: object) -> None:
    folder = sharded(tmp_path / "spec")
    edit(folder, lambda m: m["tensors"].update({"model/w": spec}))
    with pytest.raises(CheckpointLoadError, match=r"tensors\['model/w'\] must be an object with 'shape'"):
        check_shards(folder, expected(), PLAIN)


# ---- the one-process checkpoint (optimizer.pt, model.safetensors) --------------------------------------


def saved(tmp_path: Path) -> tuple[CheckpointManager, Path]:
    manager = CheckpointManager(CheckpointConfig(output_dir=tmp_path))
    model = tiny_model(0, layers=1)
    return manager, manager.save(model, trained_optimizer(model), step=1)


def forge_optimizer(folder: Path, change) -> None:
    state = torch.load(folder / "optimizer.pt", weights_only=True)
    change(state)
    torch.save(state, folder / "optimizer.pt")


@pytest.mark.parametrize(
    ("change", "field"),
    [(lambda s: s["param_groups"][0].update(lr="0.1"), "lr must be a finite number"),
     (lambda s: s["param_groups"][0].update(lr=-1000.0), r"lr must be in \[0"),
     (lambda s: s["param_groups"][0].update(betas=(5.0, 5.0)), r"betas\[0\] must be in \[0, 1\)"),
     (lambda s: s["param_groups"][0].update(eps=-1e-8), "eps must be > 0"),
     (lambda s: s["state"].update({999: {"step": torch.tensor(1.0)}}), r"optimizer does not have: \[999\]"),
     (lambda s: s["state"][0].update(step=torch.tensor(-5.0)), r"step must be in \[0"),
     (lambda s: s["state"][0]["exp_avg"].view(-1).__setitem__(0, float("nan")), "exp_avg holds NaN or inf")],
)  # fmt: skip
def test_one_process_optimizer_state_is_checked_whole(tmp_path: Path, change, field: str) -> None:
    manager, folder = saved(tmp_path)
    forge_optimizer(folder, change)
    assert_load_refused(manager, field)


def test_one_process_non_finite_weights_are_refused_before_anything_changes(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    manager, folder = saved(tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    key = next(iter(weights))
    weights[key].view(-1)[0] = float("inf")
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert_load_refused(manager, re.escape(key) + " holds NaN or inf")


def test_a_well_formed_one_process_checkpoint_still_loads_exactly(tmp_path: Path) -> None:
    manager, folder = saved(tmp_path)
    model = tiny_model(5, layers=1)
    opt = trained_optimizer(model)
    manager.load(model, opt)
    source = torch.load(folder / "optimizer.pt", weights_only=True)
    assert opt.state_dict()["param_groups"][0]["lr"] == source["param_groups"][0]["lr"]
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], source["state"][0]["exp_avg"])
