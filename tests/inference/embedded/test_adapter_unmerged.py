"""Serving a LoRA adapter unmerged (``adapter_serving="unmerged"``): the base weights untouched, peft's
``base(x) + lora_B(lora_A(x)) * scaling`` on the adapted layers, on both decoding paths; all or nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.distributed import adapter_payload
from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.inference.embedded import unmerged
from ludic.inference.embedded.adapters import AdapterRefused
from ludic.inference.weight_sync.adapter_config import AdapterPayload
from ludic.kernels.cpu.lean_decoder import LeanDecoder, StaticKVCache
from ludic.kernels.cpu.lean_weights import LORA_ATTR, bind_weights
from ludic.testing.lora import trained_lora_model

from .test_adapter_refusals import same_sample

PROMPT = [5, 6, 7, 8, 9, 10, 11]


def peft_model(model_dir: Path, targets: list[str], seed: int, **extra) -> torch.nn.Module:
    """A peft model on ``model_dir`` with non-zero A and B (as after training)."""
    return trained_lora_model(model_dir, targets, seed=seed, scale=0.1, **extra)


def peft_logps(model: torch.nn.Module, completion: list[int]) -> list[float]:
    """Each completion token's log-prob (T=1) under the trainer's peft model."""
    with torch.no_grad():
        logps = torch.log_softmax(model(torch.tensor([PROMPT + completion])).logits.float(), -1)[0]
    return [float(logps[len(PROMPT) - 1 + i, t]) for i, t in enumerate(completion)]


def sample(engine: TransformersChatClient) -> tuple[list[int], list[float]]:
    response, _ = asyncio.run(engine.complete_ids(PROMPT, SamplingConfig(max_tokens=24, temperature=1.0, seed=4)))
    return response.completion_token_ids, response.completion_logprobs


def served(engine: TransformersChatClient) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


def hooked(engine: TransformersChatClient) -> list[str]:
    """The modules carrying an unmerged term or a forward hook."""
    return sorted(n for n, m in engine.model.named_modules() if hasattr(m, LORA_ATTR) or m._forward_hooks)


@pytest.mark.parametrize("path", ["lean", "hf"])
def test_unmerged_serving_gives_the_peft_models_logprobs_with_the_base_untouched(dirs, path):
    # q/v of the fused q/k/v matmul, and up of gate/up, at two scalings: the block-diagonal deltas
    model = peft_model(dirs[0], ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"], seed=1,
                       alpha_pattern={"v_proj": 16})  # fmt: skip
    engine = TransformersChatClient(dirs[0], adapter_serving="unmerged")
    if path == "hf":
        engine._generator.lean = None
    assert (engine._generator.lean is not None) == (path == "lean")
    base = served(engine)
    base_completion, base_logps = sample(engine)
    engine.sync_adapter(adapter_payload(model), version=1)
    completion, logps = sample(engine)
    assert logps == pytest.approx(peft_logps(model, completion), abs=1e-4)
    assert all(torch.equal(v, base[k]) for k, v in served(engine).items())  # no weight was written
    assert len(hooked(engine)) == 4 * 5  # 4 layers x 5 targets
    engine.unload_adapter()
    assert hooked(engine) == [] and same_sample(sample(engine), (base_completion, base_logps))  # the base again


def test_the_lean_decoder_binds_no_lora_work_without_an_unmerged_adapter(dirs):
    engine = TransformersChatClient(dirs[0], adapter_serving="unmerged")
    lean = engine._generator.lean
    assert lean is not None
    _, layers, _, head_lora = lean.bind(8)
    assert head_lora is None and all(w.lora is None for w in layers)
    engine.sync_adapter(adapter_payload(peft_model(dirs[0], ["k_proj"], seed=2)))
    _, layers, _, _ = lean.bind(8)
    assert all(w.lora is not None and w.lora.o_proj is None and w.lora.down is None for w in layers)
    engine.sync_weights(AutoModelForCausalLM.from_pretrained(dirs[0]).state_dict(), version=5)  # drops the adapter
    _, layers, _, _ = lean.bind(8)
    assert hooked(engine) == [] and all(w.lora is None for w in layers) and engine.adapter.config is None


def test_a_failure_while_staging_changes_nothing_and_the_old_adapter_keeps_serving(dirs, monkeypatch):
    engine = TransformersChatClient(dirs[0], adapter_serving="unmerged")
    old = peft_model(dirs[0], ["q_proj", "v_proj"], seed=3)
    engine.sync_adapter(adapter_payload(old), version=2)
    before, terms = sample(engine), {n: getattr(m, LORA_ATTR) for n, m in engine.model.named_modules() if hasattr(m, LORA_ATTR)}
    built, real = [], unmerged.LoraTerm

    def failing_term(*args, **kwargs):  # the third layer's copy fails (say, out of memory)
        built.append(args)
        if len(built) == 3:
            raise MemoryError("injected: no memory for this layer's A and B")
        return real(*args, **kwargs)

    monkeypatch.setattr(unmerged, "LoraTerm", failing_term)
    with pytest.raises(MemoryError, match="injected"):
        engine.sync_adapter(adapter_payload(peft_model(dirs[0], ["k_proj", "o_proj"], seed=4)), version=3)
    now = {n: getattr(m, LORA_ATTR) for n, m in engine.model.named_modules() if hasattr(m, LORA_ATTR)}
    assert engine.policy_version == 2 and now == terms and all(now[n] is terms[n] for n in terms)
    assert same_sample(sample(engine), before)


def test_a_bad_adapter_is_refused_with_nothing_changed(dirs):
    engine = TransformersChatClient(dirs[0], adapter_serving="unmerged")
    good = peft_model(dirs[0], ["q_proj"], seed=5)
    engine.sync_adapter(adapter_payload(good), version=1)
    before = sample(engine)
    bad = adapter_payload(peft_model(dirs[0], ["q_proj"], seed=6))
    name = next(n for n in bad if n.endswith("lora_A.weight"))
    bad[name][0, 0] = float("nan")
    with pytest.raises(AdapterRefused, match="NaN"):
        engine.sync_adapter(bad, version=2)
    vocab, hidden = engine.model.model.embed_tokens.weight.shape  # a 2-D weight, but no nn.Linear to hook
    config = dataclasses.replace(bad.config, target_modules=("model.embed_tokens",), scalings=(2.0,))
    embedding = AdapterPayload({"model.embed_tokens.lora_A.weight": torch.zeros(4, hidden),
                                "model.embed_tokens.lora_B.weight": torch.zeros(vocab, 4)}, config)  # fmt: skip
    with pytest.raises(AdapterRefused, match=r"not an nn\.Linear"):
        engine.sync_adapter(embedding, version=2)
    assert engine.policy_version == 1 and same_sample(sample(engine), before)


def test_an_unknown_adapter_serving_mode_is_refused():
    with pytest.raises(ValueError, match="adapter_serving must be one of"):
        TransformersChatClient(torch.nn.Linear(1, 1), tokenizer=object(), adapter_serving="lazy")


def test_the_lean_step_adds_the_same_deltas_with_q_k_v_fused_or_apart(dirs):
    """On the CPU q/k/v run as one matmul (the deltas block-diagonal); on a GPU apart (one delta each)."""
    engine = TransformersChatClient(dirs[0], adapter_serving="unmerged")
    model = engine.model
    engine.sync_adapter(adapter_payload(peft_model(dirs[0], ["q_proj", "v_proj", "gate_proj"], seed=8,
                                                   alpha_pattern={"q_proj": 16})))  # fmt: skip
    lean = LeanDecoder(model, exact=True)
    rows, width = 3, 6
    ids, token = torch.randint(3, 200, (rows, width)), torch.tensor([7, 8, 9])
    with torch.inference_mode():
        prefill = model(input_ids=ids, use_cache=True).past_key_values
        hooked_forward = model(input_ids=torch.cat([ids, token[:, None]], 1)).logits[:, -1]  # the hooks' sum
        cos, sin = lean.rope_tables(width + 1, torch.float32)
        position, logits = torch.full((rows,), width), []
        for weights in (lean.bind(rows), bind_weights(model, False, lambda projs: projs)):
            cache = StaticKVCache.from_prefill(prefill, torch.arange(rows), torch.ones(rows, width), width + 1)
            logits.append(lean.step(weights, token, cos[position], sin[position], cache, width))
    assert len(weights[1][0].qkv) == 3 and weights[1][0].lora.qkv[1] is None  # apart: no delta on k_proj
    torch.testing.assert_close(logits[0], hooked_forward, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[1], hooked_forward, atol=1e-5, rtol=1e-5)
