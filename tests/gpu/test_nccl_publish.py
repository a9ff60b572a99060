"""On two CUDA devices: BroadcastPolicyPublisher over NCCL into Ludic's server on the second GPU.

Never run so far (no GPU was available while it was written); NCCL needs one device per rank.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.distributed import BroadcastPolicyPublisher, SyncProbe, create_vllm_publisher
from ludic.inference import ChatCompletionRequest, SamplingConfig, VLLMChatClient
from ludic.testing import build_tiny_model
from ludic.testing.server_process import running_server

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two CUDA devices (one per rank)"),
]


def test_publish_over_nccl_serves_the_new_weights(tmp_path):
    served_dir = build_tiny_model(tmp_path / "a", seed=0)
    new = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=7)).to("cuda:0")
    with running_server(served_dir, ["--device", "cuda:1"]) as url:
        client = VLLMChatClient(base_url=url, enable_weight_updates=True)
        probe = SyncProbe(new, client, [5, 6, 7, 8, 9], tolerance=1e-3)
        publisher = create_vllm_publisher(client, rank0_only=False, probe=probe, backend="nccl")
        assert isinstance(publisher.inner, BroadcastPolicyPublisher)
        publisher.publish(new.state_dict(), version=3)
        assert publisher.last_stats["sync_probe_gap"] < 1e-3
        request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "-"}],
                                        sampling=SamplingConfig(max_tokens=4, seed=0), prompt_token_ids=[5, 6, 7])  # fmt: skip
        response, _ = asyncio.run(client.complete(request))
        assert response.policy_version == 3
