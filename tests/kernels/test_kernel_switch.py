"""One switch (``cpu_kernels``) picks the CPU kernels, and a missing private op falls back to the plain path.

A torch upgrade that removes ``torch.ops.mkldnn._linear_pointwise`` or
``aten.mkldnn_linear_backward_weights`` is simulated by making the op lookup find nothing: training and
generation still run, with the plain path's values, and the probe says so in one log line.
"""

from __future__ import annotations

import logging

import pytest
import torch
from tests.training.layout.test_packing import build, grpo_items
from tests.training.test_trainer import FixedBatchSource

import ludic.kernels.cpu.onednn_linear as onednn
import ludic.kernels.cpu.segment_attention as segments
from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.inference.embedded._generation import BatchGenerator, RowRequest
from ludic.kernels import CPU_KERNELS_ENV, KernelChoice, private_ops, select
from ludic.kernels.cpu import decode_attention, decode_gemm, decode_layers, rms_norm, swiglu
from ludic.testing import tiny_model_path
from ludic.training.config import TrainerConfig
from ludic.training.presets import make_grpo
from ludic.training.trainer import Trainer

ALL_ON = KernelChoice(  # Ludic's own kernels: built here or not
    True, True, True, True, True, True, decode_gemm=decode_gemm.available(), decode_attention=decode_attention.available(),
    decode_layers=decode_layers.available(), tied_embedding_grad=True, swiglu=swiglu.available(), rms_norm=rms_norm.available(),
)


@pytest.fixture
def fresh_probes():
    """Probes run again in this test (they are cached per process), and are forgotten after it."""
    private_ops.works.cache_clear()
    yield
    private_ops.works.cache_clear()


@pytest.fixture
def without(monkeypatch, fresh_probes):
    """``without(*ops)``: the running torch as if it had none of ``ops``."""
    real = private_ops.lookup

    def remove(*ops: str) -> None:
        monkeypatch.setattr(private_ops, "lookup", lambda name: None if name in ops else real(name))
        private_ops.works.cache_clear()  # as in a process that never had them

    return remove


def test_auto_runs_every_cpu_kernel_on_the_cpu_and_none_elsewhere(monkeypatch):
    monkeypatch.delenv(CPU_KERNELS_ENV, raising=False)
    assert select("cpu") == ALL_ON  # this machine's torch has every op
    assert select("cuda:0") == KernelChoice() == select("meta")
    assert select("cpu", "off") == KernelChoice()
    if decode_gemm.available() and decode_attention.available():  # else "on" refuses, naming why (tests/kernels/cpu/test_decode_gemm.py)
        assert select(torch.device("cpu"), "on") == ALL_ON


def test_the_environment_sets_the_switch_for_every_component_left_unset(monkeypatch):
    monkeypatch.setenv(CPU_KERNELS_ENV, "off")
    assert select("cpu") == KernelChoice()
    assert select("cpu", "auto") == ALL_ON  # an explicit setting wins
    monkeypatch.setenv(CPU_KERNELS_ENV, "fast")
    with pytest.raises(ValueError, match=r"'fast' \(from \$LUDIC_CPU_KERNELS\)"):
        select("cpu")


def test_a_bad_setting_is_refused_when_the_config_is_built():
    with pytest.raises(ValueError, match="cpu_kernels must be one of"):
        TrainerConfig(cpu_kernels="yes")  # type: ignore[arg-type]


def test_a_missing_op_turns_off_only_its_kernels_and_is_logged_once(without, caplog):
    without(private_ops.LINEAR_BACKWARD_WEIGHTS)
    with caplog.at_level(logging.WARNING, logger="ludic.kernels.private_ops"):
        first, second = select("cpu"), select("cpu")
    assert first == second == KernelChoice(
        onednn_linear=False, segment_attention=True, lean_decoder=True, packed_linear=True, shared_prefix_cache=True,
        recompute_layers=True, decode_gemm=decode_gemm.available(), decode_attention=decode_attention.available(),
        decode_layers=decode_layers.available(), tied_embedding_grad=True, swiglu=swiglu.available(), rms_norm=rms_norm.available(),
    )
    assert [r.getMessage().count("mkldnn_linear_backward_weights") for r in caplog.records] == [1]
    assert not onednn.onednn_available()  # a direct caller of the kernel falls back too


def test_on_refuses_to_run_without_the_op_it_needs(without):
    without(private_ops.LINEAR_POINTWISE)
    with pytest.raises(RuntimeError, match=r"mkldnn\._linear_pointwise.*cpu_kernels='auto'"):
        select("cpu", "on")


def test_an_op_that_gives_wrong_values_counts_as_missing(monkeypatch, fresh_probes):
    monkeypatch.setitem(private_ops.TRIALS, private_ops.FLASH_ATTENTION_CPU, lambda op: False)
    assert not select("cpu").shared_prefix_cache and select("cpu").onednn_linear


def _train(cfg: TrainerConfig, steps: int = 2) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = build("qwen2", seed=5)
    trainer = Trainer(
        model=model, algo=make_grpo(group_size=4), batch_source=FixedBatchSource(grpo_items(seed=4, max_reply=20)),
        cfg=cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
    )  # fmt: skip
    losses = [trainer.train_step_sync()["train/loss"] for _ in range(steps)]
    trainer.close()
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def _count_kernel_calls(monkeypatch) -> dict[str, int]:
    calls = {"onednn": 0, "segments": 0}
    real_apply, real_attention = onednn.OneDNNLinear.apply, segments.segment_attention_forward

    def apply(*args):
        calls["onednn"] += 1
        return real_apply(*args)

    def attention(*args, **kwargs):
        calls["segments"] += 1
        return real_attention(*args, **kwargs)

    monkeypatch.setattr(onednn.OneDNNLinear, "apply", apply)
    monkeypatch.setattr(segments, "segment_attention_forward", attention)
    monkeypatch.setattr(onednn, "MIN_ROWS", 1)  # the test batches have a few dozen rows
    return calls


def test_off_trains_on_the_plain_path_and_auto_gives_its_values(monkeypatch):
    monkeypatch.setattr(onednn, "avx512", lambda: True)  # where "auto" chooses oneDNN's linears
    calls = _count_kernel_calls(monkeypatch)
    cfg = {"max_seq_len": 64, "micro_token_budget": 4096}
    plain_losses, plain = _train(TrainerConfig(**cfg, cpu_kernels="off"))
    assert calls == {"onednn": 0, "segments": 0}
    fast_losses, fast = _train(TrainerConfig(**cfg, cpu_kernels="auto"))
    assert calls["onednn"] > 0 and calls["segments"] > 0
    assert fast_losses == pytest.approx(plain_losses, rel=1e-5, abs=1e-6)
    for name, value in plain.items():
        torch.testing.assert_close(fast[name], value, atol=1e-5, rtol=1e-4, msg=name)


def test_training_without_the_onednn_ops_runs_torchs_linear_with_its_values(monkeypatch, without):
    calls = _count_kernel_calls(monkeypatch)
    cfg = {"max_seq_len": 64, "micro_token_budget": 4096}
    plain_losses, plain = _train(TrainerConfig(**cfg, onednn_linears=False))  # the per-feature override
    without(private_ops.LINEAR_POINTWISE, private_ops.LINEAR_BACKWARD_WEIGHTS)
    losses, weights = _train(TrainerConfig(**cfg))  # auto, ops missing
    assert calls["onednn"] == 0 and calls["segments"] > 0  # block attention needs no private op
    assert losses == plain_losses  # the same path: the same numbers, bit for bit
    for name, value in plain.items():
        torch.testing.assert_close(weights[name], value, atol=0, rtol=0, msg=name)


ROWS = [  # GRPO-style: prompts repeated (the shared-prompt cache), seeded, mixed sampling
    RowRequest([5, 6, 7], SamplingConfig(temperature=0.8, max_tokens=12, seed=s)) for s in range(3)
] + [RowRequest([9, 10], SamplingConfig(temperature=1.0, top_p=0.9, max_tokens=9, seed=s)) for s in range(3, 5)]


def _generate(client: TransformersChatClient) -> list[tuple[list[int], list[float]]]:
    return [(r.completion_ids, r.logprobs) for r in client._generator.generate(ROWS)]


@torch.inference_mode()
def test_off_generates_through_the_models_forward_and_auto_gives_its_values():
    plain = TransformersChatClient(tiny_model_path(), cpu_kernels="off")
    fast = TransformersChatClient(tiny_model_path(), cpu_kernels="auto")
    assert plain._generator.lean is None and not plain._generator.share_prefix
    assert fast._generator.lean is not None and fast._generator.lean.packed and fast._generator.share_prefix
    for (tokens, logps), (ref_tokens, ref_logps) in zip(_generate(fast), _generate(plain), strict=True):
        assert tokens == ref_tokens
        assert logps == pytest.approx(ref_logps, abs=1e-5)


@torch.inference_mode()
def test_generation_without_the_private_ops_uses_torchs_linear_and_gives_the_plain_values(without):
    plain = BatchGenerator(build_engine_model(), None, set(), 0, torch.device("cpu"), cpu_kernels="off")
    without(private_ops.LINEAR_POINTWISE, private_ops.REORDER_LINEAR_WEIGHT, private_ops.FLASH_ATTENTION_CPU)
    gen = BatchGenerator(plain.model, None, set(), 0, torch.device("cpu"))
    assert gen.lean is not None and not gen.lean.packed and gen.lean.linear is torch.nn.functional.linear
    assert not gen.share_prefix  # the shared-prompt cache needs the CPU flash-attention op
    for a, b in zip(gen.generate(ROWS), plain.generate(ROWS), strict=True):
        assert a.completion_ids == b.completion_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)


def build_engine_model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_path())).eval()
