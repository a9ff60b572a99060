"""A peft LoRA model trains adapters only and publishes merged weights under the base names."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from ludic.training._lora import merged_state_dict
from ludic.training.algorithm import RLAlgorithm
from ludic.training.config import TrainerConfig
from ludic.training.loss import ReinforceLoss
from ludic.training.trainer import Trainer
from ludic.training.types import SAWBatch, SAWItem

from .onpolicy import StepIndexedSource


class NoCredit:
    """Credit is assigned by the batch source, never by the Trainer: calling this is a bug."""

    def compute(self, rollouts: list) -> dict:
        raise AssertionError("the Trainer must not run credit assignment")


def tiny_model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


def lora_model() -> torch.nn.Module:
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    return get_peft_model(tiny_model(), cfg)


class OneBatch:
    async def next_batch(self) -> SAWBatch:
        items = [
            SAWItem(
                input_ids=[5, 6, 7, 8, 9, 10],
                attention_mask=[1] * 6,
                action_mask=[0, 0, 1, 1, 1, 1],
                weight=1.0,
            ),
            SAWItem(input_ids=[5, 6, 11, 12], attention_mask=[1] * 4, action_mask=[0, 0, 1, 1], weight=1.0),
        ]
        return SAWBatch(items=items, meta={})


class RecordingPublisher:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, torch.Tensor], int | None]] = []

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        self.calls.append(({k: v.clone() for k, v in state_dict.items()}, version))


def _train_two_steps() -> tuple[torch.nn.Module, RecordingPublisher, dict[str, torch.Tensor]]:
    model = lora_model()
    base_before = {k: v.clone() for k, v in model.get_base_model().state_dict().items() if "lora_" not in k}
    publisher = RecordingPublisher()
    algo = RLAlgorithm(name="reinforce", credit_assigner=NoCredit(), loss=ReinforceLoss(old_logp_key=None))
    cfg = TrainerConfig(lr=5e-2, max_seq_len=16, micro_token_budget=32, sync_every_steps=1)
    Trainer(model=model, algo=algo, batch_source=OneBatch(), publisher=publisher, cfg=cfg).train_sync(
        num_steps=2
    )
    return model, publisher, base_before


def test_lora_publishes_merged_weights_under_base_names() -> None:
    model, publisher, base_before = _train_two_steps()
    assert [v for _, v in publisher.calls] == [1, 2]
    sent = publisher.calls[-1][0]
    # base names only (no lora_/base_layer keys), the tied head once: as the embedding
    assert set(sent) == set(tiny_model().state_dict()) - {"lm_head.weight"}

    q = model.get_base_model().model.layers[0].self_attn.q_proj
    a, b = q.lora_A["default"].weight, q.lora_B["default"].weight  # [r, in], [out, r]
    assert b.abs().sum() > 0  # the adapter trained (B starts at zero)
    expected = q.base_layer.weight + (b @ a) * (8 / 4)  # W + B A * alpha / r
    torch.testing.assert_close(sent["model.layers.0.self_attn.q_proj.weight"], expected)
    # frozen base weights are unchanged, and sent as they were
    assert torch.equal(
        sent["model.layers.0.mlp.up_proj.weight"], base_before["model.layers.0.mlp.up_proj.weight"]
    )
    assert torch.equal(q.base_layer.weight, base_before["model.layers.0.self_attn.q_proj.base_layer.weight"])


def test_merged_export_matches_peft_merge_and_leaves_the_adapter_alone() -> None:
    model, _, _ = _train_two_steps()
    ids = torch.tensor([[5, 6, 7, 8]])
    logits_before = model(input_ids=ids).logits.detach()
    lora_before = {k: v.clone() for k, v in model.named_parameters() if "lora_" in k}

    exported = merged_state_dict(model)
    reference = copy.deepcopy(model).merge_and_unload().state_dict()

    assert set(exported) == set(reference)
    for k in reference:
        torch.testing.assert_close(exported[k], reference[k], msg=k)
    assert all(torch.equal(v, lora_before[k]) for k, v in model.named_parameters() if "lora_" in k)
    assert not model.get_base_model().model.layers[0].self_attn.q_proj.merged
    torch.testing.assert_close(model(input_ids=ids).logits, logits_before)


# ---- adapter publishing: a LoRA run against a real server, checkpointed and resumed ----------------------




class RecordingAdapterPublisher:
    """Asks for adapters (``lora_publish``) and records what kind of payload each publish got."""

    lora_publish = "adapter"

    def __init__(self) -> None:
        self.kinds: list[tuple[str, int]] = []

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        self.kinds.append((type(state_dict).__name__, len(state_dict)))


def _lora_on(model_dir, init_seed: int) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(init_seed)  # lora_A's init: a resumed run must overwrite it from the checkpoint
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"])
    return get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), cfg)


def _lora_trainer(model, source, publisher, ckpt=None) -> Trainer:
    algo = RLAlgorithm(name="reinforce", credit_assigner=NoCredit(), loss=ReinforceLoss(old_logp_key=None))
    cfg = TrainerConfig(lr=2e-2, max_seq_len=16, micro_token_budget=32, sync_every_steps=1)
    return Trainer(model=model, algo=algo, batch_source=source, publisher=publisher, cfg=cfg, checkpoint_config=ckpt)


@pytest.mark.slow
def test_a_resumed_lora_run_publishes_its_adapters_and_continues_bit_identically(tmp_path) -> None:
    from ludic.distributed import BroadcastPolicyPublisher, ProbeCheckedPublisher, SyncProbe
    from ludic.inference import VLLMChatClient
    from ludic.testing import build_tiny_model
    from ludic.testing.server_process import running_server
    from ludic.training.checkpoint.resume import resume_latest
    from ludic.training.config import CheckpointConfig

    model_dir = build_tiny_model(tmp_path / "base", seed=0, hidden_size=64, num_layers=2, intermediate_size=128)
    recorder = RecordingAdapterPublisher()
    straight = _lora_trainer(_lora_on(model_dir, 1), StepIndexedSource(min_len=6, id_offset=5), recorder)
    expected = [straight.train_step_sync()["train/loss"] for _ in range(4)]
    assert recorder.kinds == [("AdapterPayload", 12)] * 4  # A and B of 3 modules in 2 layers, every step
    ckpt = CheckpointConfig(output_dir=tmp_path / "ckpt", every_n_steps=2, max_to_keep=1)
    with running_server(model_dir, ["--transfer-timeout", "5"]) as url:
        client = VLLMChatClient(base_url=url, enable_weight_updates=True)

        def publisher(model):  # adapters over gloo, each publish checked by the probe (server == trainer)
            inner = BroadcastPolicyPublisher(client, lora="adapter", timeout_s=20)
            return ProbeCheckedPublisher(inner, SyncProbe(model, client, [5, 9, 13, 17, 21, 25], tolerance=1e-4))

        first_model = _lora_on(model_dir, 1)
        first = _lora_trainer(first_model, StepIndexedSource(min_len=6, id_offset=5), publisher(first_model), ckpt)
        head = [first.train_step_sync()["train/loss"] for _ in range(2)]
        adapter_bytes = sum(p.numel() * 4 for k, p in first_model.named_parameters() if "lora_" in k)
        assert first.publisher.last_stats["publish_bytes"] == adapter_bytes  # the adapter alone was sent

        resumed_model = _lora_on(model_dir, 123)  # another adapter init: the checkpoint must restore it
        resumed = _lora_trainer(resumed_model, StepIndexedSource(start=2, min_len=6, id_offset=5), publisher(resumed_model), ckpt)
        assert resume_latest(resumed) == 2  # publishes the restored adapter at version 2; the probe checks it
        assert resumed.publisher.last_stats["sync_probe_gap"] < 1e-4
        assert resumed.publisher.last_stats["publish_tensors"] == 2 * 3 * 2  # A and B of 3 modules, 2 layers
        tail = [resumed.train_step_sync()["train/loss"] for _ in range(2)]
        assert resumed.publisher.last_stats["sync_probe_gap"] < 1e-4
    assert head + tail == expected  # bit-identical on CPU: adapters, AdamW moments and steps restored
    final = {k: p for k, p in resumed_model.named_parameters() if "lora_" in k}
    reference = {k: p for k, p in straight.model.named_parameters() if "lora_" in k}
    assert final.keys() == reference.keys() and all(torch.equal(final[k], reference[k]) for k in final)
