"""Run-config options take effect or are refused: dtype, devices, eval cadence, server batch size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ludic.config import ConfigError, parse_config

BASE = {"model": {"path": "m"}, "env": {"name": "letter_repeat"}}


def _cfg(**tables: object) -> object:
    return parse_config({**BASE, **tables}, file="run.toml")


def test_trainer_device_follows_model_device() -> None:
    cfg = _cfg(model={"path": "m", "device": "cuda:1"})
    assert cfg.trainer.model_device == "cuda:1"  # the Trainer would otherwise move the policy back to CPU
    with pytest.raises(ConfigError) as info:
        _cfg(model={"path": "m", "device": "cuda"}, trainer={"model_device": "cpu"})
    assert info.value.errors == [
        "run.toml: [trainer].model_device = 'cpu' contradicts [model].device = 'cuda'; set only [model].device"
    ]


def test_trainer_eval_cadence_follows_eval_every_n_steps() -> None:
    assert _cfg(eval={"every_n_steps": 5}).trainer.eval_every_n_steps == 5
    assert _cfg(eval={"every_n_steps": 0}).trainer.eval_every_n_steps is None
    with pytest.raises(ConfigError, match=r"\[trainer\].eval_every_n_steps = 3 contradicts \[eval\].every_n_steps = 5"):
        _cfg(eval={"every_n_steps": 5}, trainer={"eval_every_n_steps": 3})


def test_max_batch_size_is_refused_with_the_server_backend() -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(inference={"backend": "server", "server_url": "http://127.0.0.1:8000", "max_batch_size": 8})
    assert info.value.errors[0].startswith(
        "run.toml: [inference]: max_batch_size sizes the embedded engine's batches; with backend 'server'"
    )
    _cfg(inference={"backend": "server", "server_url": "http://127.0.0.1:8000"})  # the default is fine


def test_dtype_reaches_the_embedded_engine(model_dir: Path) -> None:
    from ludic.cli.runtime import make_client

    client = make_client(_cfg(model={"path": str(model_dir), "dtype": "bfloat16"}))
    assert {p.dtype for p in client.model.parameters()} == {torch.bfloat16}


def test_dtype_reaches_the_sft_warm_start(model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ludic.cli.warm_start import sft_to_dir
    from ludic.training.batching.saw_builder import prompt_completion_item

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    item = prompt_completion_item(tokenizer.encode("ab"), tokenizer.encode("cd"), weight=1.0)
    cfg = _cfg(model={"path": str(model_dir), "dtype": "bfloat16"}, trainer={"max_seq_len": 32})
    out = sft_to_dir(cfg, [item], steps=1, batch_size=1, lr=1e-3, out_dir=tmp_path / "sft")
    saved = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert {p.dtype for p in saved.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("one_sequence", [False, True])
def test_protocol_one_sequence_reaches_the_rollout_engine(one_sequence: bool) -> None:
    from ludic.cli.runtime import make_engine
    from ludic.inference import SamplingConfig

    cfg = _cfg(protocol={"name": "single_agent", "one_sequence": one_sequence})

    class Client:  # make_engine only reads the client's tokenizer here
        tokenizer = object()

    engine = make_engine(cfg, Client(), SamplingConfig())
    assert engine.one_sequence is one_sequence
