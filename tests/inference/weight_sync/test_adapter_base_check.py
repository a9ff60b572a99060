"""The weight receiver checks an adapter's base when its update starts, without the engine's weights lock:
what it sees then may be a full update half copied, so it must not keep that as the served base."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.distributed import adapter_payload
from ludic.inference import TransformersChatClient
from ludic.inference.embedded.adapters import AdapterRefused
from ludic.inference.weight_sync.receiver import WeightReceiver, parse_init_info
from ludic.inference.weight_sync.weights import assign_weights
from ludic.testing.lora import trained_lora_model


def test_a_base_check_during_a_half_copied_full_update_does_not_refuse_later_adapters(dirs):
    engine = TransformersChatClient(dirs[0])
    receiver = WeightReceiver(engine, timeout_s=5)
    receiver.init(parse_init_info({"backend": "shm"}))
    new_base = {k: v for k, v in AutoModelForCausalLM.from_pretrained(dirs[1]).state_dict().items()
                if k != "lm_head.weight"}  # tied to the embedding  # fmt: skip
    adapter = adapter_payload(trained_lora_model(dirs[1], ["q_proj"], seed=1))  # trained on the new base
    names = list(new_base)
    with engine._weights_lock, torch.no_grad():  # what ``load_validated`` does under the lock, caught halfway
        engine.adapter.restore_base(engine.model)
        assign_weights(engine.model, {k: new_base[k] for k in names[: len(names) // 2]})
        with pytest.raises(AdapterRefused, match="base"):  # neither base is served at this instant
            receiver.start(adapter.config.to_json())
        assign_weights(engine.model, {k: new_base[k] for k in names[len(names) // 2 :]})
    # before: the half-copied model's fingerprint was kept as the served base's, refusing every adapter
    assert "applied adapter" in engine.sync_adapter(adapter, version=1)
    assert engine.adapter.config == adapter.config
