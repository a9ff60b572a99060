"""``VLLMLoraPublisher``'s adapter folders on disk: named inside ``adapter_dir`` only, written into a temporary
folder of their own, and never replacing (or later deleting) anything but an adapter folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.distributed import VLLMLoraPublisher, adapter_payload
from ludic.inference.weight_sync.adapter_config import AdapterPayload
from ludic.inference.weight_sync.adapter_files import read_adapter_folder, write_adapter_folder
from ludic.testing.lora import trained_lora_model


@pytest.fixture(scope="module")
def payload(dirs: tuple[Path, Path]) -> AdapterPayload:
    return adapter_payload(trained_lora_model(dirs[0], ["q_proj"], seed=0))


@pytest.mark.parametrize("name", ["../escape", "/home/someone/project", "team/policy", "a\\b", "nul\0byte"])
def test_a_lora_name_that_is_not_one_folder_name_is_refused_before_anything_is_written(name, tmp_path):
    """The folders are ``adapter_dir/<lora_name>-v<N>``, deleted once ``keep`` newer ones exist: ``../x``
    or an absolute name would write (and later delete) folders outside ``adapter_dir``."""
    with pytest.raises(ValueError, match="must be one folder name"):
        VLLMLoraPublisher(client=None, adapter_dir=tmp_path / "adapters", lora_name=name)
    assert list(tmp_path.iterdir()) == []


def test_a_stale_temporary_folder_is_neither_written_into_nor_moved(payload, tmp_path):
    """Before, the temporary folder was ``.tmp-<name>``, reused when it existed (a crashed writer's, a
    second publisher's, anyone's): its files were published with the adapter, then deleted with it."""
    stale = tmp_path / ".tmp-p-v1"
    stale.mkdir()
    (stale / "notes.txt").write_text("precious")
    folder = write_adapter_folder(payload, tmp_path / "p-v1", version=1)
    assert (stale / "notes.txt").read_text() == "precious"
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert read_adapter_folder(folder)[1] == 1


def test_only_an_adapter_folder_is_replaced(payload, tmp_path):
    """Publishing the same version again replaces its adapter folder; a folder holding anything else, or a
    link, at that path is refused untouched (the publisher would later delete what it replaced)."""
    write_adapter_folder(payload, tmp_path / "p-v1", version=1)
    write_adapter_folder(payload, tmp_path / "p-v1", version=2)
    assert read_adapter_folder(tmp_path / "p-v1")[1] == 2
    user = tmp_path / "p-v2"
    user.mkdir()
    (user / "thesis.tex").write_text("precious")
    (tmp_path / "p-v3").symlink_to(user)
    for target in (user, tmp_path / "p-v3"):
        with pytest.raises(FileExistsError, match="is not an adapter folder"):
            write_adapter_folder(payload, target, version=3)
    assert [p.name for p in user.iterdir()] == ["thesis.tex"] and (user / "thesis.tex").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p-v1", "p-v2", "p-v3"]  # no temporary folder left
