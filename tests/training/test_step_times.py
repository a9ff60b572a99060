"""Every step's metrics split its wall time under ``time/``: the batch source's generation and credit, the
rest of ``next_batch`` as waiting, preprocessing, forward-backward, optimizer and publish; the parts add up
to ``time/step_seconds``. ``perf/train_seconds`` is the forward-backward and optimizer time only (it used to
start before ``next_batch``, generation included)."""

from __future__ import annotations

import time

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.distributed import ClientPublisher
from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.inference.sampling import InferenceSpec
from ludic.interaction import SingleAgentProtocol
from ludic.training.batching import RolloutBatchSource, RolloutEngine
from ludic.training.config import TrainerConfig
from ludic.training.presets import make_grpo
from ludic.training.trainer import Trainer
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest

from .batching.test_rollout_engine import EchoEnv, _identity_parser

WAIT_S = 0.3  # the request source's own delay: data the step waits for
SCORE_S = 0.05  # each env step's delay: part of playing the episodes


class SlowEchoEnv(EchoEnv):
    def env_step(self, action: str):
        time.sleep(SCORE_S)
        return super().env_step(action)


def test_the_time_parts_add_up_to_the_step_and_train_seconds_excludes_generation() -> None:
    from ludic.testing import tiny_model_path

    client = TransformersChatClient(tiny_model_path())

    def protocol():
        return SingleAgentProtocol(agent=Agent(client=client, model="tiny", ctx=FullDialog(), parser=_identity_parser))

    engine = RolloutEngine(env_registry={"echo": SlowEchoEnv}, protocol_registry={"single": protocol})
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=8))

    def requests() -> list[RolloutRequest]:
        time.sleep(WAIT_S)
        return [RolloutRequest(EnvSpec("echo", {"target": "a"}), ProtocolSpec("single"), inference=spec, sampling_seed=s)
                for s in range(2)]  # fmt: skip

    algo = make_grpo(group_size=4)
    source = RolloutBatchSource(engine=engine, request_fn=requests, algorithm=algo, max_steps=1)
    from transformers import AutoModelForCausalLM

    trainer = Trainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_path()), algo=algo, batch_source=source,
        publisher=ClientPublisher(client), cfg=TrainerConfig(lr=1e-3, max_seq_len=128, sync_every_steps=1),
    )  # fmt: skip
    stats = trainer.train_step_sync()
    parts = {k: v for k, v in stats.items() if k.startswith("time/") and k != "time/step_seconds"}
    assert set(parts) >= {
        "time/generate_seconds", "time/score_seconds", "time/credit_seconds", "time/wait_seconds", "time/preprocess_seconds",
        "time/forward_backward_seconds", "time/optimizer_seconds", "time/publish_seconds",
    }  # fmt: skip
    assert all(v >= 0 for v in parts.values())
    step = stats["time/step_seconds"]
    assert 0.9 * step <= sum(parts.values()) <= step, (parts, step)
    assert stats["time/wait_seconds"] >= WAIT_S
    assert stats["time/score_seconds"] >= 8 * SCORE_S  # 8 episodes, one env step each
    assert stats["time/generate_seconds"] > 0  # the sampling, apart from the envs' steps
    assert stats["perf/step_seconds"] == step
    compute = stats["time/forward_backward_seconds"] + stats["time/optimizer_seconds"]
    assert compute <= stats["perf/train_seconds"] <= compute + 0.05
    assert stats["perf/train_seconds"] < step - WAIT_S - 8 * SCORE_S
    computed, distinct = stats["perf/computed_tokens"], stats["perf/distinct_tokens"]
    assert 0 < distinct <= computed and stats["perf/padding_fraction"] == (computed - distinct) / computed
    assert 0 <= stats["perf/padding_fraction"] < 1
    assert distinct < stats["perf/real_tokens"]  # the group's prompt is computed once for its 4 replies
    assert "perf/padding_efficiency" not in stats and "perf/padded_tokens" not in stats


def test_overlapping_env_steps_count_once() -> None:
    """Two episodes' async env steps (a verifier awaiting a subprocess) overlap: their wall time counts once."""
    import asyncio

    from ludic.training.batching.busy_clock import BusyClock

    clock = BusyClock()
    step = clock.wrap(asyncio.sleep)

    async def two() -> None:
        await asyncio.gather(step(0.2), step(0.2))
        await step(0.1)

    asyncio.run(two())
    assert 0.3 <= clock.seconds < 0.45


def test_a_reference_scorers_time_is_its_own_part_taken_out_of_preprocessing() -> None:
    from ludic.training.algorithm import RLAlgorithm
    from ludic.training.loss import ReinforceLoss
    from ludic.training.reference.scoring import FrozenModelScorer

    from .onpolicy import NoCredit, tiny_model
    from .test_trainer import ITEMS, FixedBatchSource

    def slow_filter(batch):
        time.sleep(WAIT_S)  # preprocessing that is not the scorer
        return batch

    scorer = FrozenModelScorer(tiny_model(1))
    algo = RLAlgorithm(name="r", credit_assigner=NoCredit(), loss=ReinforceLoss(old_logp_key=None),
                       preprocess=lambda b: scorer(slow_filter(b)))  # fmt: skip
    trainer = Trainer(model=tiny_model(0), algo=algo, batch_source=FixedBatchSource(ITEMS),
                      cfg=TrainerConfig(lr=1e-3, max_seq_len=32))  # fmt: skip
    stats = trainer.train_step_sync()
    assert stats["time/ref_logps_seconds"] > 0
    assert WAIT_S <= stats["time/preprocess_seconds"] < WAIT_S + 0.2  # the filter's time, the scorer's apart
    parts = sum(v for k, v in stats.items() if k.startswith("time/") and k != "time/step_seconds")
    assert 0.9 * stats["time/step_seconds"] <= parts <= stats["time/step_seconds"]
    assert not any(k.startswith("train/time") for k in stats)  # step times are not batch stats
