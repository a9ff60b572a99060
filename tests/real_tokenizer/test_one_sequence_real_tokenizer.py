"""One-sequence multi-turn on SmolLM2's real BPE tokenizer: the model samples "Hel" "lo" " wor" "ld", whose
text re-encodes as "Hello" " world", and Ludic trains the sampled ids, never the re-tokenisation."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.real_tokenizer.ids import EOS, HELLO_WORLD, HELLO_WORLD_CANONICAL

from ludic.agents import Agent
from ludic.context import FullDialog, RecentMessages
from ludic.envs import SingleAgentEnv
from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.inference.template_ids import chat_template_ids
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.training import EnvSpec, EpisodicReturn, ProtocolSpec, RLAlgorithm, RolloutEngine, RolloutRequest
from ludic.training.batching import rollouts_to_saw_items
from ludic.training.batching.sequence_items import rollout_to_sequence_items
from ludic.training.loss import ReinforceLoss
from ludic.types import StepOutcome

SAMPLED = [*HELLO_WORLD, EOS]


class TurnsEnv(SingleAgentEnv):
    """``turns`` turns; each observation names the turn; reward 1 per turn."""

    def __init__(self, turns: int = 3) -> None:
        self.turns = turns

    def env_reset(self, *, seed=None):
        self.t = 0
        return self.env_current_obs(), {}

    def env_current_obs(self) -> str:
        return f"Turn {self.t}: say hello."

    def env_step(self, action: str) -> StepOutcome:
        self.t += 1
        return StepOutcome(self.env_current_obs(), 1.0, False, self.t >= self.turns)


@pytest.fixture(scope="module")
def client(successor_dir: Path) -> TransformersChatClient:
    return TransformersChatClient(successor_dir)


def _agent(client, *, exact: bool, ctx=None) -> Agent:
    return Agent(client=client, model="m", ctx=ctx or FullDialog(system_prompt="Greet."), parser=lambda t: ParseResult(t),
                 sampling=SamplingConfig(temperature=1.0, max_tokens=8), exact_sequence=exact)  # fmt: skip


async def _episode(client, *, exact: bool, ctx=None, turns: int = 3):
    (rollout,) = await SingleAgentProtocol(_agent(client, exact=exact, ctx=ctx)).run(
        env=TurnsEnv(turns), max_steps=turns, sampling_seed=5
    )
    return rollout


def _action_spans(item) -> list[list[int]]:
    spans: list[list[int]] = []
    for i, (tok, flag) in enumerate(zip(item.input_ids, item.action_mask, strict=True)):
        if flag and (i == 0 or not item.action_mask[i - 1]):
            spans.append([])
        if flag:
            spans[-1].append(tok)
    return spans


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


async def test_exact_sequence_trains_the_sampled_split_ids_as_one_sequence(client, tokenizer):
    rollout = await _episode(client, exact=True)
    traces = [s.trace for s in rollout.steps]
    assert [t.completion_token_ids for t in traces] == [SAMPLED] * 3  # the model sampled the split every turn
    assert all("sequence_break" not in s.info for s in rollout.steps)
    (item,) = rollout_to_sequence_items(rollout, {(rollout.id, s.index): 1.0 for s in rollout.steps})
    assert item.input_ids == traces[-1].prompt_token_ids + traces[-1].completion_token_ids
    assert _action_spans(item) == [SAMPLED] * 3  # exactly the sampled ids, and only they, are trained
    assert not _contains(item.input_ids, HELLO_WORLD_CANONICAL)
    for trace in traces:  # every call's prompt is the sequence so far
        assert item.input_ids[: len(trace.prompt_token_ids)] == trace.prompt_token_ids
    # what a re-render of the same conversation would have trained instead: the canonical "Hello" " world"
    history = [{"role": "system", "content": "Greet."}]
    for step in rollout.steps:
        history += [{"role": "user", "content": step.prev_obs}, {"role": "assistant", "content": step.action}]
    rerendered = chat_template_ids(tokenizer, history[:-1])
    assert tokenizer.decode(rerendered) == tokenizer.decode(traces[-1].prompt_token_ids)  # the same text...
    assert rerendered != traces[-1].prompt_token_ids and _contains(rerendered, HELLO_WORLD_CANONICAL)  # ...other ids
    assert item.attachments.actor_logps is not None and len(item.attachments.actor_logps.token_logps) == 15


async def test_without_exact_sequence_the_re_rendered_prompts_split_the_episode_and_each_call_trains_its_ids(client):
    rollout = await _episode(client, exact=False)
    traces = [s.trace for s in rollout.steps]
    assert _contains(traces[1].prompt_token_ids, HELLO_WORLD_CANONICAL)  # the reply re-tokenised in the prompt
    items = rollout_to_sequence_items(rollout, {(rollout.id, s.index): 1.0 for s in rollout.steps})
    assert [it.meta["step_indices"] for it in items] == [[0], [1], [2]]  # never merged across a re-tokenisation
    for item, trace in zip(items, traces, strict=True):
        assert item.input_ids == trace.prompt_token_ids + SAMPLED and _action_spans(item) == [SAMPLED]
    per_step = rollouts_to_saw_items([rollout], {(rollout.id, s.index): 1.0 for s in rollout.steps})
    assert [it.input_ids for it in per_step] == [it.input_ids for it in items]


async def test_a_context_that_drops_history_breaks_the_sequence_and_says_why(client):
    rollout = await _episode(client, exact=True, ctx=RecentMessages(keep=1, system_prompt="Greet."))
    assert rollout.steps[1].info["sequence_break"] == "the context rewrote or dropped earlier messages"
    items = rollout_to_sequence_items(rollout, {(rollout.id, s.index): 1.0 for s in rollout.steps})
    assert len(items) == 3 and all(_action_spans(it) == [SAMPLED] for it in items)


async def test_rollout_engine_one_sequence_trains_the_sampled_ids(client):
    def protocol():
        return SingleAgentProtocol(_agent(client, exact=True))

    engine = RolloutEngine(env_registry={"turns": TurnsEnv}, protocol_registry={"p": protocol}, one_sequence=True)
    request = RolloutRequest(EnvSpec("turns", {"turns": 3}), ProtocolSpec("p"), num_episodes=2)
    batch = await engine.generate_batch([request], RLAlgorithm("episodic", EpisodicReturn(), ReinforceLoss()), max_steps=3)
    assert len(batch.items) == 2
    for item in batch.items:
        assert item.meta["one_sequence"] and item.meta["step_indices"] == [0, 1, 2]
        assert _action_spans(item) == [SAMPLED] * 3 and not _contains(item.input_ids, HELLO_WORLD_CANONICAL)


async def test_a_stop_string_ending_inside_a_token_trains_the_whole_sampled_token(client, tokenizer):
    """BPE only: "wo" stops inside the sampled token " wor". The text is cut ("Hello "), the ids are not: the
    sequence holds and trains " wor" as sampled, and the next prompt follows it."""
    agent = _agent(client, exact=True)
    agent.sampling = SamplingConfig(temperature=1.0, max_tokens=8, stop=("wo",))
    (rollout,) = await SingleAgentProtocol(agent).run(env=TurnsEnv(2), max_steps=2, sampling_seed=5)
    first, second = (s.trace for s in rollout.steps)
    assert first.completion_token_ids == HELLO_WORLD[:3] and rollout.steps[0].action == "Hello "
    head = [*first.prompt_token_ids, *HELLO_WORLD[:3]]
    assert second.prompt_token_ids[: len(head)] == head
    assert tokenizer.decode(second.prompt_token_ids[len(head) :]).startswith("<|im_end|>\n<|im_start|>user\nTurn 1")
    (item,) = rollout_to_sequence_items(rollout, {(rollout.id, s.index): 1.0 for s in rollout.steps})
    assert _action_spans(item) == [HELLO_WORLD[:3], HELLO_WORLD[:3]]


async def test_the_trainer_scores_the_sampled_ids_as_the_engine_did(client, successor_dir):
    """The item's action tokens are where the engine sampled them: the trainer's log-probs agree with the
    engine's (a re-tokenised "Hello" " world", or a shift by one, would score about -20 a token)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ludic.training.layout.micro_batching import collate_saw_items
    from ludic.training.loss import compute_token_logps

    rollout = await _episode(client, exact=True)
    (item,) = rollout_to_sequence_items(rollout, {(rollout.id, s.index): 1.0 for s in rollout.steps})
    model = AutoModelForCausalLM.from_pretrained(successor_dir)
    batch = collate_saw_items([item], pad_token_id=EOS, device="cpu")
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logps = compute_token_logps(logits, batch["input_ids"])[0]
    trained = [float(logps[i]) for i, flag in enumerate(item.action_mask) if flag]
    actor = item.attachments.actor_logps.token_logps
    assert len(trained) == len(actor) == 15
    assert max(abs(a - b) for a, b in zip(trained, actor, strict=True)) < 1e-3
