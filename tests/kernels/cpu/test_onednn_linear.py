"""``onednn_linears``: the training forward/backward's fp32 CPU linears on oneDNN, same values and gradients
as torch's path to fp32 rounding; other dtypes untouched; ``TrainerConfig(onednn_linears=...)`` takes effect."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.training.test_trainer import make_trainer, params_of, tiny_model

import ludic.kernels.cpu.onednn_linear as onednn
from ludic.kernels.cpu.onednn_linear import OneDNNLinear, onednn_available, onednn_linears
from ludic.training.config import TrainerConfig

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN")


@pytest.fixture(autouse=True)
def _as_on_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN runs on any x86 CPU; it is chosen only where AVX-512 makes it pay (``forward_pays``). These tests
    check its path, so they run under that choice whatever this CPU is; the choice itself is tested below."""
    monkeypatch.setattr(onednn, "avx512", lambda: True)


def _grads(fn, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, upstream: torch.Tensor):
    leaves = [t for t in (x, w, b) if t is not None]
    for t in leaves:
        t.grad = None
    out = fn(x, w, b)
    (out * upstream).sum().backward()
    return out.detach(), [t.grad.clone() if t.grad is not None else None for t in leaves]


@pytest.mark.parametrize(
    ("shape", "out_features", "bias"),
    [((3, 50, 24), 40, True), ((70, 40), 24, False), ((2, 5, 64), 8, True), ((1, 1, 16), 16, False)],
)
def test_values_and_all_three_gradients_match_float64(shape, out_features, bias) -> None:
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    w = torch.randn(out_features, shape[-1], requires_grad=True)
    b = torch.randn(out_features, requires_grad=True) if bias else None
    upstream = torch.randn(*shape[:-1], out_features)
    got, got_grads = _grads(OneDNNLinear.apply, x, w, b, upstream)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if b is not None else None
    want, want_grads = _grads(F.linear, x64, w64, b64, upstream.double())
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    for g, h in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, h.float(), rtol=1e-5, atol=1e-4)


def test_a_frozen_weight_gets_no_gradient_and_the_input_still_does() -> None:
    x = torch.randn(4, 6, requires_grad=True)
    w = torch.randn(5, 6)  # requires_grad False: a frozen base layer under LoRA
    OneDNNLinear.apply(x, w, None).sum().backward()
    assert w.grad is None
    torch.testing.assert_close(x.grad, w.sum(0).expand(4, 6))


def test_only_fp32_cpu_linears_of_the_model_inside_the_block_take_the_onednn_path() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    x = torch.randn(2, onednn.MIN_ROWS // 2, 8, requires_grad=True)
    with onednn_linears(model):
        inside = model(x)
        as_float64 = model.double()(x.double())
        model.float()
    outside = model(x)
    with onednn_linears(model, enabled=False):
        disabled = model(x)
    assert type(inside.grad_fn).__name__ == "OneDNNLinearBackward"
    assert "OneDNN" not in type(as_float64.grad_fn).__name__
    assert "OneDNN" not in type(outside.grad_fn).__name__ and "OneDNN" not in type(disabled.grad_fn).__name__
    assert all("forward" not in m.__dict__ for m in model)  # the layers are given back as they were
    torch.testing.assert_close(inside, outside, rtol=1e-6, atol=1e-6)


def test_inputs_of_fewer_than_min_rows_stay_on_torchs_linear() -> None:
    layer = torch.nn.Linear(8, 4)
    with onednn_linears(layer):
        few = layer(torch.randn(onednn.MIN_ROWS - 1, 8, requires_grad=True))
        enough = layer(torch.randn(onednn.MIN_ROWS, 8, requires_grad=True))
    assert "OneDNN" not in type(few.grad_fn).__name__
    assert type(enough.grad_fn).__name__ == "OneDNNLinearBackward"


@pytest.mark.parametrize("with_bias", [False, True])
def test_weight_and_bias_gradients_equal_torchs(with_bias) -> None:
    torch.manual_seed(0)
    x, dy, weight = torch.randn(600, 96), torch.randn(600, 40), torch.randn(40, 96)
    grad_w, grad_b = onednn.weight_and_bias_grads(dy, x, weight, with_bias)
    torch.testing.assert_close(grad_w, dy.t().mm(x), rtol=1e-5, atol=1e-4)
    assert grad_w.is_contiguous() and grad_w.layout == torch.strided
    if with_bias:
        torch.testing.assert_close(grad_b, dy.sum(0), rtol=1e-5, atol=1e-4)
    else:
        assert grad_b is None


def test_wide_layers_take_onednn_from_fewer_rows_than_narrow_ones() -> None:
    wide, narrow = torch.nn.Linear(onednn.WIDE_FEATURES, onednn.WIDE_FEATURES), torch.nn.Linear(8, onednn.WIDE_FEATURES)
    assert onednn.min_rows(onednn.WIDE_FEATURES, onednn.WIDE_FEATURES) == onednn.WIDE_MIN_ROWS < onednn.MIN_ROWS
    with onednn_linears(wide), onednn_linears(narrow):
        wide_few = wide(torch.randn(onednn.WIDE_MIN_ROWS - 1, onednn.WIDE_FEATURES, requires_grad=True))
        wide_enough = wide(torch.randn(onednn.WIDE_MIN_ROWS, onednn.WIDE_FEATURES, requires_grad=True))
        narrow_same = narrow(torch.randn(onednn.WIDE_MIN_ROWS, 8, requires_grad=True))
    assert "OneDNN" not in type(wide_few.grad_fn).__name__
    assert type(wide_enough.grad_fn).__name__ == "OneDNNLinearBackward"
    assert "OneDNN" not in type(narrow_same.grad_fn).__name__  # 8 inputs: narrow, so MIN_ROWS applies


@pytest.mark.parametrize("threads", [1, 2])
def test_on_amd_cpus_the_weight_gradient_stays_on_mkl(threads, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onednn, "amd_cpu", lambda: True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert not onednn._weight_grad_pays(4688, 1536, 512) and not onednn._weight_grad_pays(600, 256, 256)
    finally:
        torch.set_num_threads(before)


def test_the_cpu_vendor_is_read_from_proc_cpuinfo() -> None:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            vendor = next((line for line in f if line.startswith("vendor_id")), "")
    except OSError:
        vendor = ""
    assert onednn.amd_cpu() == ("AuthenticAMD" in vendor)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_weight_gradient_takes_mkl_below_the_size_where_onednn_pays_with_threads(threads, monkeypatch) -> None:
    monkeypatch.setattr(onednn, "amd_cpu", lambda: False)  # the Intel rule
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        small, large = onednn._weight_grad_pays(1200, 128, 128), onednn._weight_grad_pays(1200, 256, 256)
    finally:
        torch.set_num_threads(before)
    assert large and small == (threads == 1)


@pytest.mark.parametrize("amd", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_both_weight_gradient_paths_equal_torchs(threads, amd, monkeypatch) -> None:
    monkeypatch.setattr(onednn, "amd_cpu", lambda: amd)  # both CPU rules run here, whichever this CPU is
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for out_features in (16, 512):  # under and over MIN_WEIGHT_GRAD_MACS at 600 rows x 256
            layer = torch.nn.Linear(256, out_features)
            x = torch.randn(600, 256)
            with onednn_linears(layer):
                layer(x).square().sum().backward()
            mine = layer.weight.grad.clone(), layer.bias.grad.clone()
            layer.zero_grad()
            layer(x).square().sum().backward()
            torch.testing.assert_close(mine[0], layer.weight.grad, rtol=1e-4, atol=1e-3)
            torch.testing.assert_close(mine[1], layer.bias.grad, rtol=1e-4, atol=1e-3)
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def apply_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts ``OneDNNLinear.apply`` calls in ``["n"]``; MIN_ROWS is 1 (the tiny test batches have a few dozen rows)."""
    calls = {"n": 0}
    real_apply = OneDNNLinear.apply

    def counting_apply(*args):
        calls["n"] += 1
        return real_apply(*args)

    monkeypatch.setattr(onednn.OneDNNLinear, "apply", counting_apply)
    monkeypatch.setattr(onednn, "MIN_ROWS", 1)
    return calls


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_trainer_option_takes_effect_and_both_paths_train_the_same_weights(apply_calls, checkpointing) -> None:
    runs = {}
    for enabled in (False, True):
        apply_calls["n"] = 0
        cfg = TrainerConfig(
            lr=1e-2, max_seq_len=32, micro_token_budget=64, onednn_linears=enabled,
            gradient_checkpointing=checkpointing,
        )  # fmt: skip
        trainer = make_trainer(model=tiny_model(5), cfg=cfg)
        losses = [s["train/loss"] for s in trainer.train_sync(3)]
        runs[enabled] = (losses, params_of(trainer.model), apply_calls["n"])
        trainer.close()
    (off_losses, off_params, off_calls), (on_losses, on_params, on_calls) = runs[False], runs[True]
    assert off_calls == 0 and on_calls > 0  # every layer of every micro-batch of 3 steps (and recomputes)
    assert on_losses == pytest.approx(off_losses, rel=1e-5, abs=1e-6)
    for name, value in on_params.items():
        torch.testing.assert_close(value, off_params[name], rtol=1e-4, atol=1e-5)


def test_the_frozen_model_scorer_scores_the_same_on_either_path(apply_calls) -> None:
    from tests.training.test_trainer import make_item

    from ludic.training.reference.scoring import FrozenModelScorer

    scores = {}
    for enabled in (False, True):
        apply_calls["n"] = 0
        items = [make_item(n, rid=f"r{n}") for n in (6, 9, 14)]
        FrozenModelScorer(tiny_model(2), onednn_linears=enabled).score_items(items)
        scores[enabled] = ([it.attachments.frozen_logps["ref_logps"] for it in items], apply_calls["n"])
    (off, off_calls), (on, on_calls) = scores[False], scores[True]
    assert off_calls == 0 and on_calls > 0
    for a, b in zip(off, on, strict=True):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-5)


def test_the_input_gradient_reads_the_transposed_weight_as_a_view_with_the_copys_bits(monkeypatch) -> None:
    """This torch's oneDNN op takes ``W^T`` as a strided view (probed), giving the contiguous copy's values
    exactly; where the probe fails the copy is made, as before."""
    assert onednn.takes_transposed_weight()  # the torch pinned here
    torch.manual_seed(3)
    dy, x, weight = torch.randn(600, 96), torch.randn(600, 160), torch.randn(96, 160)
    grads = {}
    for view in (True, False):
        monkeypatch.setattr(onednn, "takes_transposed_weight", lambda view=view: view)
        assert onednn.transposed_weight(weight).is_contiguous() == (not view)
        grads[view] = onednn.linear_grads(dy, x, weight, need_x=True, need_w=False, need_b=False)[0]
    assert torch.equal(grads[True], grads[False])
    torch.testing.assert_close(grads[True], dy @ weight, rtol=1e-5, atol=1e-4)


def test_without_avx512_every_layer_and_the_mlps_down_projection_stay_on_mkl(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an AVX2 CPU (an AMD EPYC Zen 3) oneDNN's forward and grad input were slower than MKL's at the main
    job's shapes, so there a block switched to oneDNN runs torch's own linear, with torch's numbers."""
    import ludic.kernels.cpu.recompute as recompute
    from ludic.kernels.cpu.recompute import GatedMLPDown

    monkeypatch.setattr(onednn, "avx512", lambda: False)
    wide = onednn.WIDE_FEATURES
    assert not onednn.forward_pays(100_000, wide, 3 * wide)
    model = torch.nn.Sequential(torch.nn.Linear(wide, wide), torch.nn.Linear(wide, 8))
    x = torch.randn(onednn.MIN_ROWS, wide)
    with onednn_linears(model):
        inside = model(x)
    assert "OneDNN" not in type(inside.grad_fn).__name__
    assert torch.equal(inside, model(x))  # torch's path: the same bits
    gate, up = (torch.randn(onednn.MIN_ROWS, 2 * wide, requires_grad=True) for _ in range(2))
    down = torch.randn(wide, 2 * wide, requires_grad=True)
    calls = []
    for module in (onednn, recompute):
        monkeypatch.setattr(module, "inner_product", lambda *a: calls.append(a) or pytest.fail("ran on oneDNN"))
    out = GatedMLPDown.apply(gate, up, down, None, True, False)
    out.sum().backward()
    assert calls == [] and gate.grad is not None and down.grad is not None
    torch.testing.assert_close(out, F.linear(F.silu(gate) * up, down), rtol=1e-5, atol=1e-5)
