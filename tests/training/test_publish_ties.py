"""A weight publish sends a tied tensor once (a tied lm_head is the embedding: it was sent twice, 651 MB for a
538 MB model), and the receiver, whose model has the same tie, serves exactly the trained weights: the
embedded engine in this process, and Ludic's server over shared memory and over the HTTP blob."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.distributed import BroadcastPolicyPublisher, ClientPublisher
from ludic.inference import TransformersChatClient, VLLMChatClient
from ludic.testing.server_process import running_server
from ludic.training._step_hooks import each_tensor_once
from ludic.training.config import TrainerConfig
from ludic.training.trainer import Trainer

from .test_trainer import ITEMS, FixedBatchSource, reinforce

TIED = ("model.embed_tokens.weight", "lm_head.weight")


def trained_trainer(model_dir: Path, publisher: object) -> Trainer:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tiny model ties them
    cfg = TrainerConfig(lr=5e-2, max_seq_len=32, micro_token_budget=64, sync_every_steps=1)
    return Trainer(model=model, algo=reinforce(), batch_source=FixedBatchSource(ITEMS), publisher=publisher, cfg=cfg)


def unique_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() lists a tie once


def test_each_tensor_once_drops_the_tied_twin_and_keeps_untied_ones(tmp_path) -> None:
    from ludic.testing import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m"))
    state = {k: v.detach() for k, v in model.state_dict().items()}
    once = each_tensor_once(state, model)
    assert set(state) - set(once) == {"lm_head.weight"}
    separate = {k: v.clone() for k, v in state.items()}  # same names, no shared memory, no tie in this model
    model.config.tie_word_embeddings = False
    untied = AutoModelForCausalLM.from_config(model.config)
    assert each_tensor_once(separate, untied).keys() == separate.keys()


def test_the_embedded_engine_gets_each_tied_tensor_once_and_serves_the_trained_model(tmp_path) -> None:
    from ludic.testing import build_tiny_model

    path = build_tiny_model(tmp_path / "m")
    engine = TransformersChatClient(path)
    publisher = ClientPublisher(engine)
    trainer = trained_trainer(path, publisher)
    stats = trainer.train_step_sync()
    assert stats["perf/publish_bytes"] == unique_bytes(trainer.model)
    assert stats["perf/publish_tensors"] == len(trainer.model.state_dict()) - 1
    served = engine.model
    assert served.lm_head.weight is served.model.embed_tokens.weight  # the tie holds on the receiver
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(served.state_dict()[name], value), name
    assert not torch.equal(served.lm_head.weight, AutoModelForCausalLM.from_pretrained(path).lm_head.weight)


@pytest.mark.integration
@pytest.mark.parametrize("transport", ["shm", "gloo", "http"])
def test_the_server_gets_each_tied_tensor_once_and_serves_the_trained_model(tmp_path, transport) -> None:
    from ludic.testing import build_tiny_model

    from ..distributed.test_broadcast_publisher import greedy_logps, model_logps

    path = build_tiny_model(tmp_path / "m")
    with running_server(path, ["--transfer-timeout", "5"]) as url:
        client = VLLMChatClient(base_url=url, enable_weight_updates=True)
        if transport == "http":  # the client's own sync_weights (the HTTP body)
            publisher = ClientPublisher(client, timeout_s=20)
        else:
            publisher = BroadcastPolicyPublisher(client, backend=transport, timeout_s=20)
        sent: list[list[str]] = []
        publish = publisher.publish
        publisher.publish = lambda state, version=None: (sent.append(list(state)), publish(state, version=version))[1]  # type: ignore[method-assign]
        trainer = trained_trainer(path, publisher)
        trainer.train_step_sync()
        assert sorted(sent[0]) == sorted(set(trainer.model.state_dict()) - {"lm_head.weight"})
        served, version = greedy_logps(VLLMChatClient(base_url=url))
        assert version == 1
        expected = model_logps(trainer.model.eval(), VLLMChatClient(base_url=url))
        assert served == pytest.approx(expected, abs=1e-4)
