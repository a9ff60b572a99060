"""``ludic export`` of a damaged checkpoint (a cut or forged weights file, a missing, stray or NaN weight, an
index naming ``../``, a LoRA adapter whose config or weights are wrong) is refused by name with exit code 2,
and nothing is written; so is an OUT that cannot be written, with no temporary folder left behind."""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from ludic.cli import main

WEIGHTS = "model.safetensors"
ADAPTER = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ludic.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=32, num_layers=1, intermediate_size=64)


@pytest.fixture(scope="module")
def adapter(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter on ``tiny`` (q/v projections, lora_B non-zero), its base recorded as ``tiny``'s path."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    folder = tmp_path_factory.mktemp("adapter") / "a"
    model.save_pretrained(folder)
    return folder


def _copy(src: Path, root: Path) -> Path:
    return Path(shutil.copytree(src, root / "ckpt"))


def _refused(src: Path, root: Path, capsys: pytest.CaptureFixture[str], *named: str) -> None:
    """Export fails with code 2, the message names each of ``named``, and nothing appears beside OUT."""
    out = root / "exported"
    assert main(["export", str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert all(n in err for n in named), err
    assert not out.exists() and not [p for p in root.iterdir() if p.name.startswith(".tmp-export")]


def _edit_weights(folder: Path, name: str, edit) -> None:
    state = load_file(folder / name)
    edit(state)
    save_file(state, folder / name, metadata={"format": "pt"})


def test_a_good_adapter_exports(adapter: Path, tmp_path: Path) -> None:
    assert main(["export", str(adapter), str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / WEIGHTS).is_file()


@given(cut=st.floats(min_value=0.0, max_value=0.9999))
def test_a_weights_file_cut_anywhere_is_refused_by_name(tiny: Path, cut: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = _copy(tiny, root)
        data = (folder / WEIGHTS).read_bytes()
        (folder / WEIGHTS).write_bytes(data[: int(cut * len(data))])
        out, err = root / "exported", io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(["export", str(folder), str(out)])
        assert rc == 2 and str(folder / WEIGHTS) in err.getvalue() and not out.exists()
        assert not [p for p in root.iterdir() if p.name.startswith(".tmp-export")]


def test_a_cut_weights_file_is_named(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(tiny, tmp_path)
    data = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(data[: len(data) // 2])
    _refused(folder, tmp_path, capsys, str(folder / WEIGHTS), "truncated")


def _drop_one(state: dict) -> None:
    del state[next(k for k in state if "mlp" in k)]


def _add_stray(state: dict) -> None:
    state["model.layers.0.mlp.stray.weight"] = torch.zeros(2)


def _nan_one(state: dict) -> None:
    state[next(k for k in state if "mlp" in k)][0, 0] = float("nan")


def _narrow_one(state: dict) -> None:
    key = next(k for k in state if "mlp" in k)
    state[key] = state[key][:-1].clone()


@pytest.mark.parametrize(
    ("edit", "named"),
    [(_drop_one, "missing weights"), (_add_stray, "mlp.stray.weight"), (_nan_one, "NaN"), (_narrow_one, "mismatched")],
)
def test_weights_that_do_not_fit_are_refused_not_initialized(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit, named: str
) -> None:
    """transformers alone initializes a missing weight at random (and drops a stray one): exported as good."""
    _edited_copy_is_refused(tiny, WEIGHTS, edit, named, tmp_path, capsys)


def _edited_copy_is_refused(source: Path, weights: str, edit, named: str, tmp_path: Path, capsys) -> None:
    folder = _copy(source, tmp_path)
    _edit_weights(folder, weights, edit)
    _refused(folder, tmp_path, capsys, str(folder), named)


def test_an_index_naming_a_file_outside_the_folder_is_refused(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _copy(tiny, tmp_path)
    outside = tmp_path / "outside.safetensors"
    shutil.move(folder / WEIGHTS, outside)
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {k: "../outside.safetensors" for k in load_file(outside)}}))
    _refused(folder, tmp_path, capsys, str(index), "../outside.safetensors")


class _Payload:
    """Unpickling this would create ``path`` (a stand-in for any code a planted file could run)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (pathlib.Path.touch, (self.path,))


def test_a_planted_pickle_is_refused_and_runs_nothing(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(tiny, tmp_path)
    (folder / WEIGHTS).unlink()
    marker = tmp_path / "pwned"
    torch.save({"model.embed_tokens.weight": _Payload(marker)}, folder / "pytorch_model.bin")
    _refused(folder, tmp_path, capsys, str(folder), "could run code")
    assert not marker.exists()


@given(text=st.text(max_size=40) | st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                                                 lambda kids: st.lists(kids, max_size=3), max_leaves=6).map(json.dumps))  # fmt: skip
def test_an_adapter_config_that_is_not_an_object_is_refused_by_name(adapter: Path, text: str) -> None:
    """Invalid JSON, a list, a number: refused naming the file (was a JSONDecodeError or AttributeError)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = _copy(adapter, root)
        (folder / "adapter_config.json").write_text("" if "base_model_name_or_path" in text else text)
        out = root / "exported"
        assert main(["export", str(folder), str(out)]) == 2
        assert not out.exists()


def test_an_adapter_that_is_its_own_base_is_refused(adapter: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(adapter, tmp_path)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": str(folder)}))
    _refused(folder, tmp_path, capsys, str(folder), "its own base")  # was a RecursionError


def _drop_lora_b(state: dict) -> None:
    del state[next(k for k in state if "lora_B" in k)]


def _lora_on_k_proj(state: dict) -> None:
    state["base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"] = torch.ones(2, 32)


def _nan_lora(state: dict) -> None:
    state[next(k for k in state if "lora_B" in k)][0, 0] = float("inf")


@pytest.mark.parametrize(
    ("edit", "named"), [(_drop_lora_b, "lacks adapter weights"), (_lora_on_k_proj, "k_proj"), (_nan_lora, "NaN or inf")]
)
def test_adapter_weights_that_do_not_fit_are_refused(
    adapter: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit, named: str
) -> None:
    """peft alone leaves a missing lora_B at zero (the export is silently the base) and drops a stray one."""
    _edited_copy_is_refused(adapter, ADAPTER, edit, named, tmp_path, capsys)


def test_adapter_weights_cut_or_missing_are_named(adapter: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy(adapter, tmp_path)
    data = (folder / ADAPTER).read_bytes()
    (folder / ADAPTER).write_bytes(data[: len(data) // 2])
    _refused(folder, tmp_path, capsys, str(folder / ADAPTER))
    (folder / ADAPTER).unlink()
    _refused(folder, tmp_path, capsys, str(folder), "no adapter_model.safetensors")


def test_an_out_under_a_file_is_refused_before_loading(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert main(["export", str(tiny), str(a_file / "sub" / "out")]) == 2
    assert f"{a_file} is not a folder" in capsys.readouterr().err and a_file.read_text() == "mine"


_LIMITED = """import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
from ludic.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="a write limit set with RLIMIT_FSIZE (Linux)")
def test_a_write_that_fails_midway_leaves_nothing_and_says_so(tiny: Path, tmp_path: Path) -> None:
    """A disk that refuses writes past 4 KiB (the weights file): one line naming OUT, no partial folder."""
    out = tmp_path / "exported"
    done = subprocess.run([sys.executable, "-c", _LIMITED, "export", str(tiny), str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"cannot write {out}" in done.stderr and "nothing was written" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_eval_of_an_adapter_naming_no_base_is_one_line_not_a_traceback(
    tiny: Path, adapter: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ludic train`` / ``eval`` merge an adapter the config names as its model, as export does; its
    ``ExportError`` ("names no base model") escaped ``main`` as a traceback."""
    from .run_configs import write_run_config

    folder = _copy(adapter, tmp_path)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = None
    (folder / "adapter_config.json").write_text(json.dumps(config))
    for tokenizer_file in tiny.glob("tokenizer*"):  # the config check wants a tokenizer with the model
        shutil.copy(tokenizer_file, folder)
    run = write_run_config(tmp_path, folder, steps=1, eval_episodes=1)
    assert main(["eval", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ludic eval: ") and "names no base model" in err and "pass --base" in err
