"""On a CUDA device: the embedded engine samples exact traces and the Trainer steps and publishes."""

import pytest
import torch

from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
from ludic.testing import tiny_model_path

pytestmark = pytest.mark.gpu


async def test_engine_on_cuda_returns_logprobs_matching_a_forward_pass():
    client = TransformersChatClient(tiny_model_path(), device="cuda")
    request = ChatCompletionRequest(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        sampling=SamplingConfig(max_tokens=8, seed=0),
    )
    response, _ = await client.complete(request)
    ids = torch.tensor([response.prompt_token_ids + response.completion_token_ids], device="cuda")
    with torch.no_grad():
        logps = torch.log_softmax(client.model(ids).logits.float(), dim=-1)[0]
    start = len(response.prompt_token_ids) - 1
    recomputed = [float(logps[start + i, t]) for i, t in enumerate(response.completion_token_ids)]
    assert recomputed == pytest.approx(response.completion_logprobs, abs=1e-3)


async def test_minimal_grpo_loop_runs_on_cuda(monkeypatch):
    import importlib.util
    from pathlib import Path

    from ludic.training import TrainerConfig

    path = Path(__file__).resolve().parents[2] / "examples" / "minimal_grpo.py"
    spec = importlib.util.spec_from_file_location("minimal_grpo_gpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "TrainerConfig", lambda **kw: TrainerConfig(model_device="cuda", **kw))
    real_client = module.TransformersChatClient
    monkeypatch.setattr(module, "TransformersChatClient", lambda path: real_client(path, device="cuda"))
    stats = await module.main(steps=2)
    assert stats["train/num_samples"] == 32.0
    assert stats["train/mismatch_abs_mean"] < 1e-2


def test_shared_prompt_prefix_matches_the_plain_forward_on_cuda():
    from transformers import AutoModelForCausalLM

    from ludic.training._setup import forward_logits
    from ludic.training.batching.saw_builder import prompt_completion_item
    from ludic.training.layout.micro_batching import collate_saw_items
    from ludic.training.layout.shared_prefix import forward_shared_prefix_logits, pack_shared_prefix

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path()).to("cuda")
    prompt = list(range(10, 40))
    items = [prompt_completion_item(prompt, list(range(50, 50 + n)), weight=1.0) for n in (3, 7, 12, 5)]
    plain = forward_logits(model, collate_saw_items(items, pad_token_id=0, device="cuda"))
    packed = pack_shared_prefix(items, pad_token_id=0, device="cuda")
    shared = forward_shared_prefix_logits(model, packed)
    s = len(prompt) - 1
    for i, item in enumerate(items):
        n = len(item.input_ids) - s
        torch.testing.assert_close(shared[i, :n], plain[i, s : s + n], atol=1e-4, rtol=1e-3)
