"""Folding a LoRA adapter into the embedded engine's weights: exact, into reused buffers, all or nothing.

``W = W_base + scaling * B @ A`` is computed into one of two buffers per adapted layer that the model does
not serve, then swapped in; the base is kept untouched, so every later adapter folds onto the same base."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from ludic.distributed import adapter_payload
from ludic.inference import TransformersChatClient
from ludic.inference.embedded import adapters
from ludic.inference.weight_sync.adapter_config import AdapterPayload
from ludic.testing.lora import trained_lora_model


def payload(model_dir: Path, targets: list[str], seed: int) -> AdapterPayload:
    """A peft adapter on ``model_dir``'s base with non-zero A and B (as after training)."""
    return adapter_payload(trained_lora_model(model_dir, targets, seed=seed))


def served(engine: TransformersChatClient) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


@pytest.mark.parametrize("threads", [1, 2])  # 2: the layers shared between this thread and a helper
def test_each_adapter_serves_exactly_base_plus_its_product_on_its_layers_and_the_base_elsewhere(dirs, threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        serve_three_adapters_then_unload(dirs[0])
    finally:
        torch.set_num_threads(previous)


def serve_three_adapters_then_unload(model_dir: Path) -> None:
    engine = TransformersChatClient(model_dir)
    base = served(engine)
    for targets, seed in ((["q_proj", "v_proj"], 1), (["q_proj", "k_proj"], 2), (["q_proj", "v_proj"], 3)):
        adapter = payload(model_dir, targets, seed)
        engine.sync_adapter(adapter)
        now, folded = served(engine), set()
        for module, scaling in zip(adapter.config.target_modules, adapter.config.scalings, strict=True):
            a, b = adapter[f"{module}.lora_A.weight"], adapter[f"{module}.lora_B.weight"]
            name = f"{module}.weight"
            assert torch.equal(now[name], torch.addmm(base[name], b, a, alpha=scaling))  # bit for bit
            folded.add(name)
        assert len(folded) == 8  # 4 layers x 2 targets
        assert all(torch.equal(now[k], base[k]) for k in base if k not in folded)  # k_proj/v_proj back to base
    engine.unload_adapter()
    assert all(torch.equal(v, base[k]) for k, v in served(engine).items())


def test_steady_publishes_alternate_between_two_buffers_per_layer_and_never_write_the_served_one(dirs):
    engine = TransformersChatClient(dirs[0])
    name = "model.layers.0.self_attn.q_proj.weight"
    ptrs = []
    for seed in range(5):
        engine.sync_adapter(payload(dirs[0], ["q_proj"], seed))
        ptrs.append(engine.model.get_parameter(name).data_ptr())
    assert ptrs[1] == ptrs[3] and ptrs[2] == ptrs[4] and ptrs[1] != ptrs[2], ptrs  # no fresh memory after two
    assert engine.adapter.pristine[name].data_ptr() not in ptrs


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fold_that_fails_midway_changes_nothing_and_the_next_adapter_applies(dirs, monkeypatch, request, threads):
    request.addfinalizer(partial(torch.set_num_threads, torch.get_num_threads()))
    torch.set_num_threads(threads)  # 2: ``apply`` shares the layers with a helper thread
    engine = TransformersChatClient(dirs[0])
    engine.sync_adapter(payload(dirs[0], ["q_proj", "v_proj"], 1), version=3)
    before = served(engine)
    runs, real_run = [], adapters._Fold.run

    def failing_run(fold: adapters._Fold) -> None:  # the third layer's fold fails (say, out of memory)
        runs.append(fold)
        if len(runs) == 3:
            raise MemoryError("injected: no memory for this layer's fold")
        real_run(fold)

    monkeypatch.setattr(adapters._Fold, "run", failing_run)
    with pytest.raises(MemoryError, match="injected"):
        engine.sync_adapter(payload(dirs[0], ["q_proj", "k_proj"], 2), version=4)
    assert engine.policy_version == 3 and engine.adapter.config.target_modules[1].endswith("v_proj")
    assert all(torch.equal(v, before[k]) for k, v in served(engine).items())  # the old adapter, bit for bit
    monkeypatch.setattr(adapters._Fold, "run", real_run)
    engine.sync_adapter(payload(dirs[0], ["q_proj", "v_proj"], 1), version=4)
    assert engine.policy_version == 4
    assert all(torch.equal(v, before[k]) for k, v in served(engine).items())  # same adapter: same weights
