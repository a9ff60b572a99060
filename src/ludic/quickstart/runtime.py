"""Set-up for the quickstart: model, embedded engine, rollout engine, evaluator.

Kept apart from ``run.py`` so the training flow there reads top to bottom.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ludic.envs.letter_repeat import LetterRepeatEnv
from ludic.eval import Evaluator
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.quickstart.config import QuickstartConfig
from ludic.registry.builtins import plain_harness, single_agent_protocol
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest

ENV_KIND = "letter_repeat"
PROTOCOL_KIND = "single_agent"
EVAL_SEED_OFFSET = 1_000_000
"""Held-out env seeds start here; training and SFT seeds stay far below."""
SFT_SEED_OFFSET = 500_000


@dataclass
class Runtime:
    """The live objects of one quickstart run."""

    model: torch.nn.Module
    tokenizer: Any
    client: Any
    engine: Any
    sampling: SamplingConfig


def prepare_model_dir(cfg: QuickstartConfig) -> Path:
    """The model to start from: ``--model-dir`` as given, else a freshly built tiny model."""
    if cfg.model_dir is not None:
        path = Path(cfg.model_dir)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"--model-dir {path} has no config.json; pass a save_pretrained directory"
            )
        return path
    from ludic.testing import build_tiny_model

    return build_tiny_model(Path(cfg.output_dir) / "initial_model", seed=cfg.seed)


def build_runtime(cfg: QuickstartConfig, model_dir: Path) -> Runtime:
    """Trainer model + a separate embedded engine (weights reach it only via the publisher)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ludic.inference import TransformersChatClient
    from ludic.training.batching import RolloutEngine

    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir).to(cfg.device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    client = TransformersChatClient(  # pipeline: decode on a worker thread, beside the trainer's step
        str(model_dir), device=cfg.device, model_name="quickstart", generate_in_thread=True if cfg.pipeline else None
    )
    sampling = SamplingConfig(temperature=1.0, max_tokens=cfg.max_new_tokens)
    env_registry: dict[str, Callable[..., Any]] = {ENV_KIND: LetterRepeatEnv}

    def make_protocol(**kwargs: Any) -> Any:  # fresh agent per episode: agents are stateful
        agent = plain_harness(  # a reply cut at max_tokens scores 0: the task's reward stays in [0, 1]
            client=client,
            model="quickstart",
            tokenizer=client.tokenizer,
            sampling=sampling,
            incomplete_reward=0.0,
        )
        return single_agent_protocol(agent=agent, **kwargs)

    engine = RolloutEngine(env_registry=env_registry, protocol_registry={PROTOCOL_KIND: make_protocol})
    return Runtime(model=model, tokenizer=tokenizer, client=client, engine=engine, sampling=sampling)


def task_request(
    cfg: QuickstartConfig, *, env_seed: int, sampling_seed: int, sampling: SamplingConfig
) -> RolloutRequest:
    return RolloutRequest(
        env=EnvSpec(kind=ENV_KIND, kwargs={"count": cfg.count, "letters": cfg.letters}),
        protocol=ProtocolSpec(kind=PROTOCOL_KIND),
        env_seed=env_seed,
        sampling_seed=sampling_seed,
        inference=InferenceSpec(sampling=sampling),
        num_episodes=1,
        meta={"env_seed": env_seed},
    )


def make_evaluator(cfg: QuickstartConfig, runtime: Runtime, out_dir: Path) -> Evaluator:
    """Held-out seeds, sampled at temperature 1 with fixed sampling seeds: the policy's expected reward."""
    requests = [
        task_request(
            cfg, env_seed=EVAL_SEED_OFFSET + i, sampling_seed=EVAL_SEED_OFFSET + i, sampling=runtime.sampling
        )
        for i in range(cfg.eval_episodes)
    ]
    return Evaluator(
        engine=runtime.engine,
        requests=requests,
        max_steps=1,
        sampling=runtime.sampling,
        concurrency=cfg.eval_episodes,
        out_dir=out_dir,
    )


class TrainRequests:
    """``request_fn`` for the RolloutBatchSource: fresh training seeds every call (it forms the groups)."""

    def __init__(self, cfg: QuickstartConfig, sampling: SamplingConfig) -> None:
        self.cfg = cfg
        self.sampling = sampling
        self.next_seed = cfg.seed * 100_000

    def __call__(self) -> list[RolloutRequest]:
        base = []
        for _ in range(self.cfg.prompts_per_step):
            base.append(
                task_request(
                    self.cfg, env_seed=self.next_seed, sampling_seed=self.next_seed, sampling=self.sampling
                )
            )
            self.next_seed += 1
        return base
