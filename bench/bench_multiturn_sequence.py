"""One-sequence vs per-step training items for an 8-turn episode, side by side in one run.

A real 8-turn episode is played with the tiny model (``Agent(exact_sequence=True)``, 48-byte
observations, replies of up to 24 tokens) and credited per turn (``PerTurnReturn``: returns 8..1).
Its training data is built both ways:
- per step: 8 items, each re-sending the whole history as its prompt (O(T^2) tokens);
- one sequence (``RolloutEngine(one_sequence=True)``): 1 item holding every turn once, each reply
  carrying its turn's return as per-token weights.
Reported: tokens to train, and forward + backward time of the same ReinforceLoss over each
(per-step items in one padded micro-batch, as the Trainer packs them), interleaved, medians.
The loss and gradient agree (tests/training/batching/test_sequence_items.py).

Run: ``OMP_NUM_THREADS=2 .venv/bin/python bench/bench_multiturn_sequence.py [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.testing import tiny_model_path
from ludic.training.batching import rollouts_to_saw_items
from ludic.training.batching.sequence_items import rollout_to_sequence_items
from ludic.training.credit.per_turn import PerTurnReturn
from ludic.training.layout.micro_batching import collate_saw_items
from ludic.training.loss import ReinforceLoss
from ludic.types import StepOutcome

TURNS = 8


class WordyEnv(SingleAgentEnv):
    """``turns`` turns, a 46-byte observation each, reward 1 per turn."""

    def __init__(self, turns: int = TURNS) -> None:
        self.turns = turns

    def env_reset(self, *, seed=None):
        self.t = 0
        return self.env_current_obs(), {}

    def env_current_obs(self) -> str:
        return f"Turn {self.t}: say something new about {self.t:>3}, briefly."

    def env_step(self, action: str) -> StepOutcome:
        self.t += 1
        return StepOutcome(self.env_current_obs(), 1.0, False, self.t >= self.turns)


async def play(model_dir: Path):
    client = TransformersChatClient(model_dir)
    agent = Agent(
        client=client, model="tiny", ctx=FullDialog(system_prompt="You are counting."),
        parser=lambda t: ParseResult(t), sampling=SamplingConfig(temperature=1.0, max_tokens=24, seed=0),
        exact_sequence=True,
    )  # fmt: skip
    (rollout,) = await SingleAgentProtocol(agent).run(env=WordyEnv(TURNS), max_steps=TURNS, sampling_seed=1)
    return rollout


def fwd_bwd(model, items, loss_fn) -> float:
    started = time.perf_counter()
    model.zero_grad()
    batch = collate_saw_items(items, pad_token_id=0, device="cpu")
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss, _ = loss_fn.compute(logits, batch)
    loss.backward()
    return time.perf_counter() - started


def main(repeats: int) -> None:
    model_dir = tiny_model_path()
    rollout = asyncio.run(play(model_dir))
    weights = PerTurnReturn().compute([rollout])
    per_step = rollouts_to_saw_items([rollout], weights)
    one = rollout_to_sequence_items(rollout, weights)
    assert len(rollout.steps) == TURNS and len(one) == 1, (len(rollout.steps), len(one))
    assert one[0].token_weights is not None  # per-turn credit, still one sequence
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    loss_fn = ReinforceLoss(old_logp_key=None)
    step_times, seq_times = [], []
    for _ in range(repeats):
        step_times.append(fwd_bwd(model, per_step, loss_fn))
        seq_times.append(fwd_bwd(model, one, loss_fn))
    real_step = sum(it.num_tokens for it in per_step)
    padded_step = len(per_step) * max(it.num_tokens for it in per_step)
    action = sum(it.num_action_tokens for it in per_step)
    ts, to = statistics.median(step_times), statistics.median(seq_times)
    print(f"torch threads {torch.get_num_threads()}; machine shared with other jobs: compare ratios")
    print(f"{TURNS}-turn episode, {action} action tokens, per-turn credit {sorted(set(weights.values()))}")
    print(f"per-step items : {len(per_step)} items, {real_step} tokens ({padded_step} padded), fwd+bwd {ts * 1e3:.1f} ms")
    print(f"one sequence   : 1 item, {one[0].num_tokens} tokens, fwd+bwd {to * 1e3:.1f} ms")
    print(f"saving         : {real_step / one[0].num_tokens:.2f}x fewer tokens ({padded_step / one[0].num_tokens:.2f}x "
          f"padded), {ts / to:.2f}x faster")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    main(parser.parse_args().repeats)
