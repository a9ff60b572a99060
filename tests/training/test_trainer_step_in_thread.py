"""``TrainerConfig(step_in_thread=True)``: the step computes on a worker thread while the event loop
serves others; same numbers as on the loop's thread; a cancelled step finishes first; weights
published from the thread reach the embedded engine whole (no reply mixes two policy versions)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping

import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.distributed import ClientPublisher
from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
from ludic.testing import tiny_model_path
from ludic.training.config import TrainerConfig
from ludic.training.trainer import Trainer

from .test_trainer import FixedBatchSource, make_item, make_trainer, params_of, reinforce, tiny_model

CFG = {"lr": 1e-2, "max_seq_len": 32, "micro_token_budget": 64}


def test_the_threaded_step_gives_the_same_losses_and_weights_as_the_loop_thread() -> None:
    runs = {}
    for in_thread in (False, True):
        trainer = make_trainer(model=tiny_model(3), cfg=TrainerConfig(**CFG, step_in_thread=in_thread))
        losses = [s["train/loss"] for s in trainer.train_sync(3)]
        runs[in_thread] = (losses, params_of(trainer.model), trainer.step)
        trainer.close()
    (loop_losses, loop_params, loop_steps), (thread_losses, thread_params, thread_steps) = runs[False], runs[True]
    assert thread_losses == loop_losses and thread_steps == loop_steps == 3
    assert all(torch.equal(loop_params[k], v) for k, v in thread_params.items())


class GatedPublisher:
    """Blocks the step (it publishes at the end of the step's compute) until released."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.thread_names: list[str] = []

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        self.thread_names.append(threading.current_thread().name)
        self.entered.set()
        if not self.release.wait(timeout=30):
            raise TimeoutError("the test never released the publisher")


async def test_the_event_loop_runs_other_tasks_while_the_step_computes() -> None:
    publisher = GatedPublisher()
    trainer = make_trainer(cfg=TrainerConfig(**CFG, step_in_thread=True), publisher=publisher)
    step = asyncio.ensure_future(trainer.train_step())
    while not publisher.entered.is_set():  # the loop itself waits here: it is free while the step computes
        await asyncio.sleep(0.005)
    ticks = 0
    for _ in range(5):  # other coroutines run mid-step
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 5 and not step.done() and trainer.step == 1  # compute done, publish still held
    publisher.release.set()
    stats = await step
    assert stats["train/loss"] == stats["train/loss"] and publisher.thread_names == ["ludic-trainer_0"]
    trainer.close()


async def test_a_cancelled_step_finishes_before_the_cancellation_propagates() -> None:
    publisher = GatedPublisher()
    trainer = make_trainer(cfg=TrainerConfig(**CFG, step_in_thread=True), publisher=publisher)
    step = asyncio.ensure_future(trainer.train_step())
    await asyncio.to_thread(publisher.entered.wait, 30)
    step.cancel()
    await asyncio.sleep(0.05)
    assert not step.done()  # still waiting for the step's thread, not abandoning it mid-update
    publisher.release.set()
    with pytest.raises(asyncio.CancelledError):
        await step
    assert trainer.step == 1 and publisher.thread_names == ["ludic-trainer_0"]
    trainer.close()


class SnapshotPublisher(ClientPublisher):
    """Publishes to the engine and keeps a copy of every version's weights, to check replies against."""

    def __init__(self, client: TransformersChatClient, first: dict[str, torch.Tensor]) -> None:
        super().__init__(client)
        self.snapshots = {0: first}

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        super().publish(state_dict, version=version)
        self.snapshots[int(version)] = {k: v.detach().clone() for k, v in state_dict.items()}  # type: ignore[arg-type]


def _logps_under(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        logps = torch.log_softmax(model(torch.tensor([prompt + completion])).logits.float(), dim=-1)
    return [float(logps[0, len(prompt) - 1 + i, tok]) for i, tok in enumerate(completion)]


async def test_weights_published_from_the_thread_never_mix_versions_in_a_reply() -> None:
    path = tiny_model_path()
    client = TransformersChatClient(str(path), generate_in_thread=True, max_batch_size=4)
    model = AutoModelForCausalLM.from_pretrained(path)
    publisher = SnapshotPublisher(client, {k: v.clone() for k, v in model.state_dict().items()})
    items = [make_item(n, w, f"r{n}") for n, w in ((8, 1.0), (10, -1.0), (12, 1.0))]
    trainer = make_trainer(
        model=model, items=items, cfg=TrainerConfig(lr=0.05, max_seq_len=32, micro_token_budget=64,
                                                    step_in_thread=True), publisher=publisher,
    )  # fmt: skip
    request = lambda i: ChatCompletionRequest(  # noqa: E731
        model="tiny", messages=[{"role": "user", "content": f"q{i}"}], sampling=SamplingConfig(max_tokens=24, seed=i)
    )
    stop = asyncio.Event()
    replies = []

    async def sample() -> None:
        i = 0
        while not stop.is_set():
            replies.extend(await asyncio.gather(*[client.complete(request(i + j)) for j in range(4)]))
            i += 4

    sampler = asyncio.ensure_future(sample())
    await trainer.train(4)
    stop.set()
    await sampler
    trainer.close()
    versions = {resp.policy_version for resp, _ in replies}
    assert len(versions) >= 2, versions  # generation went on while the trainer stepped and published
    check = AutoModelForCausalLM.from_pretrained(path)
    for resp, _ in replies:  # each reply is exactly what its tagged version's weights give
        loaded = check.load_state_dict(publisher.snapshots[resp.policy_version], strict=False)
        assert loaded.missing_keys in ([], ["lm_head.weight"])  # a publish sends the tied head once (the embedding)
        got = _logps_under(check, resp.prompt_token_ids, resp.completion_token_ids)
        assert got == pytest.approx(resp.completion_logprobs, abs=1e-4), resp.policy_version
    assert client.policy_version == trainer.step == 4
    assert all(torch.equal(v, client.model.state_dict()[k]) for k, v in trainer.model.state_dict().items())


class SourceWithReadAhead(FixedBatchSource):
    """Leaves a task pending on the trainer's loop after each batch, as the pipeline source's read-ahead does."""

    def __init__(self, items) -> None:
        super().__init__(items)
        self.cleaned_up = 0
        self.ahead: list[asyncio.Task] = []

    async def next_batch(self):
        self.ahead.append(asyncio.get_running_loop().create_task(self._read_ahead()))
        return await super().next_batch()

    async def _read_ahead(self) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            self.cleaned_up += 1


def test_close_cancels_what_is_pending_on_the_sync_loop_and_lets_it_clean_up() -> None:
    source = SourceWithReadAhead([make_item(n, 1.0, f"r{n}") for n in (6, 8)])
    trainer = Trainer(model=tiny_model(), algo=reinforce(), batch_source=source, cfg=TrainerConfig(**CFG))
    trainer.train_sync(2)
    assert source.cleaned_up == 0 and not any(task.done() for task in source.ahead)
    trainer.close()
    assert source.cleaned_up == 2 and all(task.cancelled() for task in source.ahead)
