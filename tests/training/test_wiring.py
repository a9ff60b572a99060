"""ludic.training.wiring: SeededRequests hands out seeds in order and resumes; online_trainer and sft_trainer
train a real tiny model (the embedded engine plays the episodes) with one algorithm object end to end."""

from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.distributed import ClientPublisher
from ludic.envs import SingleAgentEnv
from ludic.inference import InferenceSpec, SamplingConfig, TransformersChatClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.training import (
    EnvSpec,
    ProtocolSpec,
    RolloutEngine,
    SeededRequests,
    TrainerConfig,
    make_grpo,
    sft_items,
)
from ludic.training.wiring import online_trainer, seeded_episode, sft_trainer
from ludic.types import StepOutcome

SAMPLING = SamplingConfig(temperature=1.0, max_tokens=3)
request = seeded_episode("say", "agent", sampling=SAMPLING, seed_sampling=False)


def test_seeded_episode_builds_the_request_for_one_seed() -> None:
    game = seeded_episode("ttt", "agent", env_kwargs={"opponent": "random"}, sampling=SAMPLING)(7)
    assert (game.env, game.protocol) == (EnvSpec("ttt", {"opponent": "random"}), ProtocolSpec("agent"))
    assert (game.env_seed, game.sampling_seed, game.inference) == (7, 7, InferenceSpec(SAMPLING))
    assert request(3).sampling_seed is None and request(3).env_seed == 3


def test_seeded_requests_hand_out_consecutive_seeds_and_resume_from_the_state_dict() -> None:
    requests = SeededRequests(request, per_step=3, next_seed=10)
    assert [r.env_seed for r in requests()] == [10, 11, 12]
    assert [r.env_seed for r in requests()] == [13, 14, 15]
    resumed = SeededRequests(request, per_step=3)
    resumed.load_state_dict(requests.state_dict())
    assert [r.env_seed for r in resumed()] == [16, 17, 18]


def test_seeded_requests_refuse_to_reach_the_stop_seed_and_keep_their_position() -> None:
    requests = SeededRequests(request, per_step=2, next_seed=0, stop=3)
    assert [r.env_seed for r in requests()] == [0, 1]
    with pytest.raises(ValueError, match=r"ran out of seeds.*stop=3"):
        requests()
    assert requests.state_dict() == {"next_seed": 2}


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"per_step": 0}, "per_step"), ({"per_step": 1, "stop": 0}, "stop")]
)
def test_seeded_requests_reject_bad_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SeededRequests(request, **kwargs)


class SayLetter(SingleAgentEnv):
    """One step: reward 1 if the reply is the letter the prompt names."""

    def env_reset(self, *, seed: int | None = None):
        self.letter = random.Random(seed).choice("ab")
        return self.env_current_obs(), {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(None, float(action.strip() == self.letter), False, True, {})

    def env_current_obs(self) -> str:
        return f"Say {self.letter}"


def test_online_trainer_plays_the_requests_and_trains_with_the_one_algorithm(model_dir: Path) -> None:
    client = TransformersChatClient(str(model_dir), model_name="policy")
    model = AutoModelForCausalLM.from_pretrained(model_dir)

    def protocol() -> SingleAgentProtocol:
        return SingleAgentProtocol(
            agent=Agent(client=client, model="policy", ctx=FullDialog(), parser=ParseResult)
        )

    engine = RolloutEngine(env_registry={"say": SayLetter}, protocol_registry={"agent": protocol})
    requests = SeededRequests(request, per_step=2)
    algo = make_grpo(group_size=3)
    trainer = online_trainer(
        model, engine=engine, algo=algo, request_fn=requests, concurrency=6, publisher=ClientPublisher(client),
        cfg=TrainerConfig(lr=1e-3, max_seq_len=128, micro_token_budget=2048),
    )  # fmt: skip
    assert trainer.algo is algo and trainer.batch_source.algorithm is algo
    history = asyncio.run(trainer.train(1))
    assert history[-1]["train/target_rollouts"] == 6  # 2 prompts x groups of 3: the batch source grouped them
    assert math.isfinite(history[-1]["train/loss"])
    assert requests.state_dict() == {"next_seed": 2}
    assert trainer.batch_source.state_dict()["request_fn"] == {
        "next_seed": 2
    }  # a checkpoint keeps the position


def test_sft_trainer_lowers_the_loss_on_its_items(model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    items = sft_items(AutoTokenizer.from_pretrained(model_dir), [("Say a", "a"), ("Say b", "b")] * 4)
    trainer = sft_trainer(model, items, batch_size=8, cfg=TrainerConfig(lr=1e-2, max_seq_len=128))
    assert trainer.algo.name == "sft"
    history = asyncio.run(trainer.train(5))
    assert history[-1]["train/loss"] < history[0]["train/loss"]
