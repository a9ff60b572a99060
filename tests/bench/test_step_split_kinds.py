"""The step split (bench/bench_step_split.py) counts every matmul and attention kernel a step runs.

If a torch upgrade renamed a kernel, the split would file its time under "rest" and make the step look
bound by its Python; this profiles a real model's forward and backward, plain and with Ludic's oneDNN
linears, and checks no product or attention op is left out.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_step_split import kernel_seconds, kind_of

import ludic.kernels.cpu.onednn_linear as onednn_linear
from ludic.kernels.cpu.onednn_linear import onednn_available, onednn_linears

KERNEL_WORDS = ("mm", "linear", "attention", "mkldnn")
WRAPPERS = {  # records around the kernels (their own time is dispatch), not kernels
    "aten::linear",
    "aten::matmul",
    "aten::scaled_dot_product_attention",
    "OneDNNLinear",
}


def profiled_step(onednn: bool) -> profile:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation="sdpa",
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    ids = torch.randint(0, 64, (4, 160))  # 640 rows: above oneDNN's minimum (MIN_ROWS)
    with onednn_linears(model, enabled=onednn), profile() as prof:
        model(input_ids=ids).logits.sum().backward()
    return prof


@pytest.mark.parametrize("onednn", [False, True])
def test_every_product_and_attention_kernel_is_counted(onednn: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if onednn and not onednn_available():
        pytest.skip("this torch cannot run oneDNN's linear ops")
    monkeypatch.setattr(onednn_linear, "avx512", lambda: True)  # oneDNN chosen, as on an AVX-512 CPU
    prof = profiled_step(onednn)
    names = {e.key for e in prof.key_averages() if e.self_cpu_time_total > 0}
    unclassified = {
        n for n in names
        if kind_of(n) is None and n not in WRAPPERS and not n.startswith(("autograd::", "torch::autograd"))
        and any(w in n.lower() for w in KERNEL_WORDS) and "Backward" not in n
    }  # fmt: skip
    assert not unclassified, f"kernels the split files under 'rest': {sorted(unclassified)}"
    seconds = kernel_seconds(prof)
    assert seconds["matmul"] > 0 and seconds["attention"] > 0
    if onednn:
        assert any("_linear_pointwise" in n for n in names)  # the oneDNN forward really ran


def test_rest_is_not_a_kernel() -> None:
    assert kind_of("aten::mul") is None and kind_of("aten::silu_backward") is None
    assert kind_of("mkldnn::_linear_pointwise") == "matmul"
    assert kind_of("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention"
