"""BroadcastPolicyPublisher against Ludic's server in a real subprocess: gloo data plane, HTTP control plane."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.distributed import BroadcastPolicyPublisher, PublishError
from ludic.inference import ChatCompletionRequest, SamplingConfig, VLLMChatClient
from ludic.inference.weight_sync.process_group import create_group, free_port
from ludic.testing.server_process import running_server

pytestmark = pytest.mark.integration
PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def server(dirs: tuple[Path, Path]) -> Iterator[str]:
    with running_server(dirs[0], ["--transfer-timeout", "3"]) as url:
        yield url


def greedy_logps(client: VLLMChatClient) -> tuple[list[float], int | None]:
    import asyncio

    async def go() -> tuple[list[float], int | None]:
        request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "-"}],
                                        sampling=SamplingConfig(temperature=0.0, max_tokens=4), prompt_token_ids=PROMPT)  # fmt: skip
        response, _ = await client.complete(request)
        await client.aclose()
        return response.completion_logprobs or [], response.policy_version

    return asyncio.run(go())


def model_logps(model: torch.nn.Module, client: VLLMChatClient) -> list[float]:
    import asyncio

    async def ids() -> list[int]:
        request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "-"}],
                                        sampling=SamplingConfig(temperature=0.0, max_tokens=4), prompt_token_ids=PROMPT)  # fmt: skip
        response, _ = await client.complete(request)
        await client.aclose()
        return response.completion_token_ids or []

    completion = asyncio.run(ids())
    with torch.no_grad():
        logps = torch.log_softmax(model(torch.tensor([PROMPT + completion])).logits.float(), -1)[0]
    return [float(logps[len(PROMPT) - 1 + i, t]) for i, t in enumerate(completion)]


@pytest.mark.parametrize("packed", [True, False])
def test_publish_over_gloo_serves_the_new_weights_at_the_new_version(server, dirs, packed):
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    new = AutoModelForCausalLM.from_pretrained(dirs[1] if packed else dirs[0])
    # buckets of 64 KiB; packed: tensors below 16 KiB packed, the larger ones sent from their own memory
    publisher = BroadcastPolicyPublisher(client, bucket_bytes=64 << 10, packed=packed, pack_below_bytes=16 << 10,
                                         timeout_s=20)  # fmt: skip
    version = 11 if packed else 12
    publisher.publish(new.named_parameters(), version=version)  # an iterator, walked lazily in buckets
    assert publisher.last_stats["publish_tensors"] == len(list(new.parameters()))
    assert publisher.last_stats["server_receive_s"] > 0 and publisher.last_stats["publish_wait_s"] > 0
    served, served_version = greedy_logps(client)
    assert served_version == version
    assert served == pytest.approx(model_logps(new, client), abs=1e-4)
    publisher.close()


def test_updates_alternate_receive_buffers_without_touching_the_weights_being_served(server, dirs):
    """The server adopts its receive buffers as the model's weights; the next update must land elsewhere."""
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    models = [AutoModelForCausalLM.from_pretrained(d) for d in dirs]
    publisher = BroadcastPolicyPublisher(client, bucket_bytes=96 << 10, pack_below_bytes=16 << 10, timeout_s=20)
    for version, model in enumerate([models[1], models[0], models[1]], start=21):
        publisher.publish(model.state_dict(), version=version)
        served, served_version = greedy_logps(client)
        assert served_version == version and served == pytest.approx(model_logps(model, client), abs=1e-4)
    assert publisher.last_stats["server_alloc_bytes"] == 0  # the third update reused the first one's buffers
    state = models[0].state_dict()
    nan = dict(state) | {"model.norm.weight": torch.full_like(state["model.norm.weight"], float("nan"))}
    with pytest.raises(PublishError, match="NaN"):
        publisher.publish(nan, version=99)
    served, served_version = greedy_logps(client)  # the refused update was received into a free buffer
    assert served_version == 23 and served == pytest.approx(model_logps(models[1], client), abs=1e-4)
    publisher.close()


@pytest.mark.parametrize("packed", [True, False])
def test_a_publish_over_several_gloo_channels_serves_bit_identical_weights(server, dirs, packed):
    """Packed: the model's one 3 MB buffer is split across 3 connections; unpacked: its tensors take turns."""
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    new = AutoModelForCausalLM.from_pretrained(dirs[1])
    served = {}
    base = 31 if packed else 34  # versions never go backwards
    for version, channels in ((base, 3), (base + 1, 1), (base + 2, 3)):  # each publisher joins the server anew
        publisher = BroadcastPolicyPublisher(client, channels=channels, packed=packed, timeout_s=20)
        publisher.publish(new.state_dict(), version=version)
        publisher.close()
        served[channels], served_version = greedy_logps(client)
        assert served_version == version
    assert served[3] == served[1]  # exactly: the same bytes arrived over 3 channels as over 1
    assert served[3] == pytest.approx(model_logps(new, client), abs=1e-4)


def test_a_broadcast_missing_on_one_channel_is_refused_and_the_old_weights_keep_serving(server, dirs):
    from ludic.inference.weight_sync.packing import TensorMeta, pack, update_info
    from ludic.inference.weight_sync.process_group import parts

    post = lambda path, body: httpx.post(server + path, json=body, timeout=30)  # noqa: E731
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    before, version = greedy_logps(client)
    port, group = free_port(), {}
    joiner = threading.Thread(target=lambda: group.update(g=create_group("127.0.0.1", port, 0, 2, backend="gloo",
                                                                        timeout_s=20, channels=2)))  # fmt: skip
    joiner.start()
    init = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2, "channels": 2}
    assert post("/init_weight_transfer_engine", {"init_info": init}).status_code == 200
    joiner.join()
    assert post("/start_weight_update", {}).status_code == 200
    state = AutoModelForCausalLM.from_pretrained(dirs[1]).state_dict()
    buffer = pack(list(state.values()))  # 3.3 MB: two parts, one per channel
    first, _second = parts(buffer, 2)
    info = update_info([TensorMeta.of(n, t) for n, t in state.items()], packed=True)
    sending = threading.Thread(target=lambda: group["g"].broadcast(first, 0).wait())  # only the first channel's
    sending.start()
    lost = post("/update_weights", {"update_info": info})
    sending.join(timeout=30)
    assert lost.status_code == 504 and "old weights keep serving" in lost.json()["error"]["message"]
    assert post("/finish_weight_update", {"weight_version": "78"}).status_code == 400
    after, after_version = greedy_logps(client)
    assert after_version == version and after == before
    bad = dict(init, channels=99)
    refused = post("/init_weight_transfer_engine", {"init_info": bad})
    assert refused.status_code == 400 and "channels must be from 1 to 16" in refused.json()["error"]["message"]


def test_bad_tensors_are_refused_with_the_reason_and_the_old_weights_keep_serving(server, dirs):
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    before, version = greedy_logps(client)
    publisher = BroadcastPolicyPublisher(client, timeout_s=20)
    state = AutoModelForCausalLM.from_pretrained(dirs[1]).state_dict()
    with pytest.raises(PublishError, match=r"lm_head\.weight.*shape"):
        publisher.publish(dict(state) | {"lm_head.weight": torch.zeros(3, 3)}, version=99)
    with pytest.raises(PublishError, match="no parameter 'nope'"):
        publisher.publish({"nope": torch.zeros(2)}, version=99)
    nan = dict(state) | {"model.norm.weight": torch.full_like(state["model.norm.weight"], float("nan"))}
    with pytest.raises(PublishError, match="NaN"):
        publisher.publish(nan, version=99)
    after, after_version = greedy_logps(client)
    assert after_version == version and after == pytest.approx(before, abs=1e-6)
    assert client.is_paused_sync() is False  # each failed publish still resumed the server
    publisher.close()


def test_unknown_names_and_a_broadcast_that_never_arrives_are_refused(server, dirs):
    post = lambda path, body: httpx.post(server + path, json=body, timeout=30)  # noqa: E731
    version = httpx.get(server + "/policy_version").json()["policy_version"]
    port = free_port()
    group: dict[str, object] = {}
    joiner = threading.Thread(target=lambda: group.update(g=create_group("127.0.0.1", port, 0, 2, backend="gloo", timeout_s=20)))
    joiner.start()
    init = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2}
    assert post("/init_weight_transfer_engine", {"init_info": init}).status_code == 200
    joiner.join()
    assert post("/start_weight_update", {}).status_code == 200
    unknown = post("/update_weights", {"update_info": {"names": ["nope"], "dtype_names": ["float32"], "shapes": [[2]]}})
    assert unknown.status_code == 400 and "unknown parameter name 'nope'" in unknown.json()["error"]["message"]
    info = {"names": ["model.norm.weight"], "dtype_names": ["float32"], "shapes": [[128]], "packed": True}
    lost = post("/update_weights", {"update_info": info})  # nobody broadcasts: the server times out
    assert lost.status_code == 504 and "old weights keep serving" in lost.json()["error"]["message"]
    finish = post("/finish_weight_update", {"weight_version": "77"})
    assert finish.status_code == 400
    assert httpx.get(server + "/policy_version").json()["policy_version"] == version


@pytest.mark.parametrize("backend", ["gloo", "shm"])
def test_a_tied_state_dict_sends_its_embedding_once_and_serves_it_under_both_names(server, dirs, backend):
    """The tiny model ties ``lm_head.weight`` to ``model.embed_tokens.weight``: its state dict names that
    tensor twice. The bytes go once; ``/finish_weight_update``'s ``aliases`` gives the server the other name."""
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    new = AutoModelForCausalLM.from_pretrained(dirs[1])
    state = new.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    distinct = list(new.parameters())  # torch lists a tied parameter once
    publisher = BroadcastPolicyPublisher(client, backend=backend, timeout_s=20)
    version = httpx.get(server + "/policy_version").json()["policy_version"] + 1
    publisher.publish(state, version=version)
    stats = publisher.last_stats
    assert stats["publish_tied_names"] == 1 and stats["publish_tensors"] == len(distinct) == len(state) - 1
    assert stats["publish_bytes"] == sum(t.numel() * t.element_size() for t in distinct)
    served, served_version = greedy_logps(client)
    assert served_version == version and served == pytest.approx(model_logps(new, client), abs=1e-4)
    publisher.close()


class AliasingPublisher(BroadcastPolicyPublisher):
    """A publisher whose finish call carries the ``aliases`` a hostile or broken client might send."""

    aliases: object = None

    def _owned(self, body: dict) -> dict:
        body = super()._owned(body)
        return body | {"aliases": self.aliases} if "weight_version" in body else body


@pytest.mark.parametrize(
    ("aliases", "message"),
    [({"lm_head.weight": 3}, "aliases must map names to names"),
     (["lm_head.weight"], "aliases must map names to names"),
     ({"": "model.norm.weight"}, "aliases must map names to names"),
     ({"lm_head.weight": "nope"}, "points at 'nope', which the blob does not hold"),
     ({"model.norm.weight": "model.embed_tokens.weight"}, "also sent as a tensor of its own"),
     ({"extra.weight": "model.norm.weight"}, r"unknown parameter names \['extra.weight'\]"),
     ({"lm_head.weight": "model.norm.weight"}, "lm_head.weight")],  # a [128] tensor where [vocab, 128] goes
)
def test_aliases_that_do_not_fit_are_refused_and_nothing_of_the_update_is_applied(server, dirs, aliases, message):
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    before, version = greedy_logps(client)
    publisher = AliasingPublisher(client, backend="shm", timeout_s=20)
    publisher.aliases = aliases
    with pytest.raises(PublishError, match=message):
        publisher.publish(AutoModelForCausalLM.from_pretrained(dirs[1]).state_dict(), version=version + 1)
    after, after_version = greedy_logps(client)
    assert after_version == version and after == pytest.approx(before, abs=1e-6)
    assert client.is_paused_sync() is False
    publisher.close()


def test_a_dead_server_fails_the_publish_with_a_clear_error_not_a_hang():
    client = VLLMChatClient(base_url=f"http://127.0.0.1:{free_port()}", enable_weight_updates=True, backoff_s=0.05)
    publisher = BroadcastPolicyPublisher(client, timeout_s=5)
    with pytest.raises(PublishError, match="could not reach the server"):
        publisher.publish({"w": torch.zeros(2)}, version=1)


def sft_items() -> list:
    from ludic.training.batching.saw_builder import prompt_completion_item

    return [prompt_completion_item(PROMPT, [10 + i, 11 + i], weight=1.0, meta={"rollout_id": f"r{i}", "total_reward": 1.0,
            "policy_version": 0}) for i in range(4)]  # fmt: skip


@pytest.mark.slow  # a server of its own and a trainer step: ~12 s
def test_a_trainer_step_publishes_over_gloo_and_the_probe_reports_its_gap(dirs):
    """A fresh server: the trainer publishes version 1, and versions never go backwards."""
    with running_server(dirs[0]) as server:
        _trainer_step_publishes(server, dirs)


def _trainer_step_publishes(server: str, dirs: tuple[Path, Path]) -> None:
    from ludic.distributed import SyncProbe, create_vllm_publisher
    from ludic.training import RLAlgorithm, Trainer, TrainerConfig
    from ludic.training.loss import ReinforceLoss
    from ludic.training.types import SAWBatch

    class Fixed:
        async def next_batch(self) -> SAWBatch:
            return SAWBatch(items=sft_items(), meta={})

    class NoCredit:
        def compute(self, rollouts):  # pragma: no cover - the batch source gives weighted items
            return {}

    model = AutoModelForCausalLM.from_pretrained(dirs[0])
    client = VLLMChatClient(base_url=server, enable_weight_updates=True)
    probe = SyncProbe(model, client, [*PROMPT, 10, 11], tolerance=1e-4)
    publisher = create_vllm_publisher(client, probe=probe, timeout_s=20)
    algo = RLAlgorithm(name="sft", credit_assigner=NoCredit(), loss=ReinforceLoss(old_logp_key=None))
    trainer = Trainer(model=model, algo=algo, batch_source=Fixed(), publisher=publisher,
                      cfg=TrainerConfig(lr=5e-2, max_seq_len=32, micro_token_budget=256))  # fmt: skip
    stats = trainer.train_step_sync()
    trainer.close()
    assert stats["perf/sync_probe_gap"] < 1e-4 and stats["perf/publish_tensors"] > 0
    assert stats["train/staleness_mean"] == 0.0
    served, version = greedy_logps(client)
    assert version == 1
    assert served == pytest.approx(model_logps(model, client), abs=1e-4)


@pytest.mark.slow
def test_the_probe_catches_an_update_the_server_did_not_apply(dirs):
    from ludic.distributed import SyncCheckError, SyncProbe, create_vllm_publisher

    new = AutoModelForCausalLM.from_pretrained(dirs[1])
    with running_server(dirs[0], ["--drop-weight-updates"]) as url:
        client = VLLMChatClient(base_url=url, enable_weight_updates=True)
        publisher = create_vllm_publisher(client, rank0_only=False, probe=SyncProbe(new, client, PROMPT), timeout_s=20)
        with pytest.raises(SyncCheckError, match=r"did not \(fully\) apply"):
            publisher.publish(new.state_dict(), version=4)
