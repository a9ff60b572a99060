"""A multi-turn episode trained as one exact sequence: the ids trained are the ids sampled, and
the gradient is the sum of the per-step items' gradients."""

import itertools

import pytest
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
from ludic.training.layout.micro_batching import collate_saw_items, truncate_item
from ludic.training.loss import (
    CISPOLoss,
    MaskedCausalLMCrossEntropyLoss,
    ReinforceLoss,
    TokenClippedSurrogateLoss,
)
from ludic.types import Rollout, Step, StepOutcome, TokenTrace


class CountTurnsEnv(SingleAgentEnv):
    """``turns`` turns; each observation names the turn; reward 1 per turn."""

    def __init__(self, turns: int = 4) -> None:
        self.turns = turns

    def env_reset(self, *, seed=None):
        self.t = 0
        return self.env_current_obs(), {}

    def env_current_obs(self) -> str:
        return f"turn {self.t}"

    def env_step(self, action: str) -> StepOutcome:
        self.t += 1
        return StepOutcome(self.env_current_obs(), 1.0, False, self.t >= self.turns)


@pytest.fixture(scope="module")
def client():
    return TransformersChatClient(tiny_model_path())


async def _episode(client, *, exact: bool, ctx=None, turns: int = 4):
    agent = Agent(
        client=client,
        model="tiny",
        ctx=ctx or FullDialog(system_prompt="Count."),
        parser=lambda t: ParseResult(t),
        sampling=SamplingConfig(temperature=1.0, max_tokens=6, seed=3),
        exact_sequence=exact,
    )
    (rollout,) = await SingleAgentProtocol(agent).run(env=CountTurnsEnv(turns), max_steps=turns, sampling_seed=7)
    return rollout


async def test_one_sequence_holds_exactly_the_ids_sent_and_sampled(client):
    rollout = await _episode(client, exact=True)
    traces = [s.trace for s in rollout.steps]
    assert len(traces) == 4 and all("sequence_break" not in s.info for s in rollout.steps)
    (item,) = rollout_to_sequence_items(rollout, {(rollout.id, s.index): 0.5 for s in rollout.steps})
    assert item.input_ids == traces[-1].prompt_token_ids + traces[-1].completion_token_ids
    expected_mask, pos = [0] * len(item.input_ids), 0
    for trace in traces:  # each call's prompt is the sequence so far: never a re-tokenised reply
        assert item.input_ids[: len(trace.prompt_token_ids)] == trace.prompt_token_ids
        pos = len(trace.prompt_token_ids)
        assert item.input_ids[pos : pos + len(trace.completion_token_ids)] == trace.completion_token_ids
        expected_mask[pos : pos + len(trace.completion_token_ids)] = [1] * len(trace.completion_token_ids)
    assert item.action_mask == expected_mask
    assert item.attachments.actor_logps.token_logps == [x for t in traces for x in t.completion_logprobs]
    assert item.meta["step_indices"] == [0, 1, 2, 3] and item.meta["num_calls"] == 4
    per_step = rollouts_to_saw_items([rollout], {(rollout.id, s.index): 0.5 for s in rollout.steps})
    assert item.num_tokens < sum(it.num_tokens for it in per_step)


def _grad_of(model, loss_fn, items):
    """Summed loss and flat gradient over ``items``, each its own batch (losses that sum over tokens)."""
    model.zero_grad()
    total = 0.0
    for it in items:
        batch = collate_saw_items([it], pad_token_id=0, device="cpu")
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss, _ = loss_fn.compute(logits, batch)
        loss.backward()
        total += float(loss.detach())
    return total, torch.cat([p.grad.flatten() for p in model.parameters()])


SUMMED_LOSSES = {
    "reinforce": ReinforceLoss(old_logp_key=None),  # -sum_i sum_t A_it logp_it
    "grpo_token_clip": TokenClippedSurrogateLoss(),  # -sum_t min(r_t A_t, clip(r_t) A_t)
    "cispo_summed": CISPOLoss(length_normalize=False),  # -sum_t sg(clip(r_t)) A_t logp_t
    "sft": MaskedCausalLMCrossEntropyLoss(),  # -sum_t w_t logp_t
}


@pytest.mark.parametrize("loss_name", sorted(SUMMED_LOSSES))
async def test_per_turn_credit_trains_one_sequence_whose_gradient_is_the_per_step_sum(client, loss_name):
    rollout = await _episode(client, exact=True)
    weights = {(rollout.id, s.index): w for s, w in zip(rollout.steps, [0.7, 0.7, -0.3, 1.2], strict=True)}
    (item,) = rollout_to_sequence_items(rollout, weights)  # per-turn credit: still ONE sequence
    assert item.meta["step_indices"] == [0, 1, 2, 3] and item.token_weights is not None
    step_items = rollouts_to_saw_items([rollout], weights)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path()).double()
    seq_loss, seq_grad = _grad_of(model, SUMMED_LOSSES[loss_name], [item])
    step_loss, step_grad = _grad_of(model, SUMMED_LOSSES[loss_name], step_items)
    assert seq_loss == pytest.approx(step_loss, rel=1e-5)
    assert seq_grad.norm() > 1e-2  # a real gradient, not two zeros
    # equal up to the loss's float32 log-prob arithmetic (the model runs in float64 here)
    torch.testing.assert_close(seq_grad, step_grad, rtol=1e-4, atol=1e-6)


async def test_each_action_token_carries_its_turns_weight_through_collation_and_truncation(client):
    rollout = await _episode(client, exact=True)
    per_turn = [0.7, 0.7, -0.3, 1.2]
    weights = {(rollout.id, s.index): w for s, w in zip(rollout.steps, per_turn, strict=True)}
    (item,) = rollout_to_sequence_items(rollout, weights)
    expected = torch.zeros(len(item.input_ids), dtype=torch.float32)
    for trace, w in zip([s.trace for s in rollout.steps], per_turn, strict=True):
        start = len(trace.prompt_token_ids)  # this call's completion span in the one sequence
        expected[start : start + len(trace.completion_token_ids)] = w
    batch = collate_saw_items([item], pad_token_id=0, device="cpu")
    torch.testing.assert_close(batch["token_weight"][0], expected, rtol=0, atol=0)  # token by token
    assert ((batch["token_weight"][0] != 0) == batch["action_mask"][0].bool()).all()
    assert item.weight == pytest.approx(float(expected.sum() / batch["action_mask"].sum()))  # the summary
    # cut inside the third turn's reply: the surviving tokens keep their weights, the rest go
    third = rollout.steps[2].trace
    keep = len(third.prompt_token_ids) + len(third.completion_token_ids) // 2 + 1
    cut = truncate_item(item, keep)
    assert len(cut.token_weights) == sum(cut.action_mask) == len(cut.attachments.actor_logps.token_logps)
    cut_batch = collate_saw_items([cut], pad_token_id=0, device="cpu")
    torch.testing.assert_close(cut_batch["token_weight"][0], expected[:keep], rtol=0, atol=0)
    assert set(cut.token_weights) == {0.7, -0.3}


class EditingDialog(FullDialog):
    """A context that records the reply edited (as a history-trimming context might)."""

    def on_after_act(self, response):
        self._messages.append({"role": "assistant", "content": "[edited] " + response.text})


async def test_a_context_that_rewrites_the_reply_falls_back_to_per_step_items_and_says_why(client):
    rollout = await _episode(client, exact=True, ctx=EditingDialog(system_prompt="Count."))
    assert rollout.steps[1].info["sequence_break"] == (
        "the chat template does not render the reply exactly as sampled after the prompt"
    )
    items = rollout_to_sequence_items(rollout, {(rollout.id, s.index): 1.0 for s in rollout.steps})
    assert [it.meta["step_indices"] for it in items] == [[0], [1], [2], [3]]
    for item, step in zip(items, rollout.steps, strict=True):  # each exactly its per-step item
        assert item.input_ids == step.trace.prompt_token_ids + step.trace.completion_token_ids


async def test_without_exact_sequence_a_byte_level_template_still_extends_but_a_rewrite_splits(client):
    rollout = await _episode(client, exact=False)
    traces = [s.trace for s in rollout.steps]
    items = rollout_to_sequence_items(rollout, {(rollout.id, s.index): 1.0 for s in rollout.steps})
    extends = all(
        b.prompt_token_ids[: len(a.prompt_token_ids) + len(a.completion_token_ids)]
        == a.prompt_token_ids + a.completion_token_ids
        for a, b in itertools.pairwise(traces)
    )
    assert (len(items) == 1) is extends  # merged only where the ids really extend


async def test_rollout_engine_one_sequence_option_trains_each_episode_as_one_item(client):
    from ludic.training import (
        EnvSpec,
        EpisodicReturn,
        PerTurnReturn,
        ProtocolSpec,
        RLAlgorithm,
        RolloutEngine,
        RolloutRequest,
    )

    def protocol():
        agent = Agent(
            client=client,
            model="tiny",
            ctx=FullDialog(),
            parser=lambda t: ParseResult(t),
            sampling=SamplingConfig(max_tokens=4),
            exact_sequence=True,
        )
        return SingleAgentProtocol(agent)

    engine = RolloutEngine(
        env_registry={"count": CountTurnsEnv}, protocol_registry={"p": protocol}, one_sequence=True
    )
    request = RolloutRequest(EnvSpec("count", {"turns": 3}), ProtocolSpec("p"), num_episodes=2)
    episodic = RLAlgorithm("episodic", EpisodicReturn(), ReinforceLoss())  # every turn gets the episode's return
    batch = await engine.generate_batch([request], episodic, max_steps=3)
    assert len(batch.items) == 2
    assert all(it.meta["step_indices"] == [0, 1, 2] and it.meta["one_sequence"] for it in batch.items)
    # per-turn credit (reward-to-go 3, 2, 1): still one item per episode, each reply with its turn's return
    per_turn = RLAlgorithm("per_turn", PerTurnReturn(), ReinforceLoss(old_logp_key=None))
    batch = await engine.generate_batch([request], per_turn, max_steps=3)
    assert len(batch.items) == 2
    for item in batch.items:
        assert item.meta["step_indices"] == [0, 1, 2]
        spans, k = [], 0  # each action span's weights, in order
        for i, flag in enumerate(item.action_mask):
            if flag and (i == 0 or not item.action_mask[i - 1]):
                spans.append([])
            if flag:
                spans[-1].append(item.token_weights[k])
                k += 1
        assert [set(span) for span in spans] == [{3.0}, {2.0}, {1.0}]


def _step(index: int, prompt: list[int], completion: list[int], temperature: float) -> Step:
    trace = TokenTrace(
        prompt_token_ids=prompt, completion_token_ids=completion, completion_logprobs=[-0.5] * len(completion)
    )
    return Step(
        index,
        "obs",
        "act",
        "next",
        0.0,
        False,
        index == 1,
        info={"sampling_temperature": temperature},
        trace=trace,
    )


@pytest.mark.parametrize(("second_temperature", "items_expected"), [(0.7, 1), (1.0, 2)])
def test_calls_sampled_at_another_temperature_start_a_new_item(second_temperature, items_expected):
    # The trainer recomputes an item's log-probs at one temperature: calls sampled at two cannot share it.
    rollout = Rollout(steps=[_step(0, [1, 2], [3], 0.7), _step(1, [1, 2, 3, 4], [5, 6], second_temperature)])
    weights = {(rollout.id, 0): 1.0, (rollout.id, 1): 1.0}
    items = rollout_to_sequence_items(rollout, weights)
    assert len(items) == items_expected
    assert [item.action_mask for item in items] == (
        [[0, 0, 1, 0, 1, 1]] if items_expected == 1 else [[0, 0, 1], [0, 0, 0, 0, 1, 1]]
    )
