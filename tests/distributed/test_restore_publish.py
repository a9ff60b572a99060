"""A trainer resumed from a checkpoint older than what the server serves (a step publishes before it
checkpoints; a lost host takes the steps after the checkpoint with it) restores the checkpoint's weights on
a real Ludic server under the checkpoint's version (``declare_restore`` then the publish), and trains on;
ordinary publishes still never go back."""

from __future__ import annotations

import httpx
import pytest
import torch
from tests.training.onpolicy import StepIndexedSource
from transformers import AutoModelForCausalLM

from ludic.distributed.publisher import ClientPublisher
from ludic.inference import VLLMChatClient
from ludic.inference.http_client import RequestRefused
from ludic.testing import build_tiny_model
from ludic.testing.server_process import running_server
from ludic.training.algorithm import RLAlgorithm
from ludic.training.checkpoint.resume import resume_latest
from ludic.training.config import CheckpointConfig, TrainerConfig
from ludic.training.loss import ReinforceLoss
from ludic.training.trainer import Trainer

TOKEN = "restore-test-token"
PROMPT = [7, 12, 30, 41]


class NoCredit:
    def compute(self, rollouts: list) -> dict:
        raise AssertionError("the batch source assigns credit")


def _trainer(model_dir, url: str, ckpt: CheckpointConfig, start: int = 0) -> Trainer:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    client = VLLMChatClient(base_url=url, enable_weight_updates=True, api_key=TOKEN, timeout_s=60)
    algo = RLAlgorithm(name="reinforce", credit_assigner=NoCredit(), loss=ReinforceLoss(old_logp_key=None))
    cfg = TrainerConfig(lr=5e-2, max_seq_len=16, micro_token_budget=64, sync_every_steps=1)
    return Trainer(model=model, algo=algo, batch_source=StepIndexedSource(start), publisher=ClientPublisher(client),
                   cfg=cfg, checkpoint_config=ckpt)  # fmt: skip


def _served(url: str) -> tuple[int, float]:
    """(policy_version, the log-prob of the greedy next token after PROMPT) as the server answers them."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    version = httpx.get(url + "/policy_version", headers=headers, timeout=10).json()["policy_version"]
    body = {
        "model": "m",
        "prompt": PROMPT,
        "max_tokens": 1,
        "temperature": 0.0,
        "logprobs": 0,
        "return_token_ids": True,
    }
    choice = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=30).json()["choices"][0]
    return int(version), float(choice["logprobs"]["token_logprobs"][0])


def _local(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return model(input_ids=torch.tensor([PROMPT])).logits[0, -1].log_softmax(-1).max().item()


@pytest.mark.slow  # a server and a trainer process: ~12 s
def test_a_resumed_trainer_restores_its_checkpoint_on_a_server_already_serving_later_versions(
    tmp_path,
) -> None:
    model_dir = build_tiny_model(
        tmp_path / "model", seed=0, hidden_size=64, num_layers=2, intermediate_size=128
    )
    ckpt = CheckpointConfig(output_dir=tmp_path / "ckpt", every_n_steps=2, max_to_keep=1)
    with running_server(model_dir, ["--api-key", TOKEN]) as url:
        first = _trainer(model_dir, url, ckpt)
        for _ in range(3):  # publishes 1, 2, 3; checkpoints after step 2
            first.train_step_sync()
        lost_version, lost_logprob = _served(url)
        assert lost_version == 3 and lost_logprob == pytest.approx(_local(first.model), abs=1e-4)

        resumed = _trainer(model_dir, url, ckpt, start=2)  # the host of step 3 is gone: start from step 2
        assert resume_latest(resumed) == 2  # the old code: refused, "versions must not go backwards"
        version, logprob = _served(url)
        assert version == 2  # the checkpoint's version, its weights served, not step 3's
        assert logprob == pytest.approx(_local(resumed.model), abs=1e-4) and logprob != pytest.approx(
            lost_logprob
        )

        resumed.train_step_sync()  # step 3 again, on the restored lineage
        assert _served(url)[0] == 3
        state = {k: v for k, v in resumed.model.state_dict().items() if k != "lm_head.weight"}
        with pytest.raises(RequestRefused, match="must not go backwards"):  # a declaration lasts one update
            resumed.publisher.publish(state, version=2)
        assert _served(url)[0] == 3


@pytest.mark.slow  # a server and a trainer process: ~11 s
def test_a_declared_restore_changes_nothing_served_until_its_update_loads(tmp_path) -> None:
    model_dir = build_tiny_model(
        tmp_path / "model", seed=0, hidden_size=64, num_layers=2, intermediate_size=128
    )
    weights = {k: v for k, v in AutoModelForCausalLM.from_pretrained(model_dir).state_dict().items()
               if k != "lm_head.weight"}  # fmt: skip
    with running_server(model_dir, ["--api-key", TOKEN]) as url:
        client = VLLMChatClient(base_url=url, enable_weight_updates=True, api_key=TOKEN, timeout_s=60)
        client.sync_weights(weights, version=5)
        before = _served(url)
        assert client.declare_restore(1) is True
        assert _served(url) == before  # the old weights keep serving under their own version
        with pytest.raises(RequestRefused, match="is not a decimal integer"):
            client.post_json_sync("/ludic/declare_restore", {"version": "one"})
        unauthenticated = httpx.post(url + "/ludic/declare_restore", json={"version": 0}, timeout=10)
        assert unauthenticated.status_code == 401  # only the trainer's token may declare one
        client.sync_weights(weights, version=1)
        assert _served(url)[0] == 1
