"""A full single-agent episode on the real embedded engine with a locally built tiny model.

The random tiny model is first taught (~150 SFT steps on this very dialog, pushed to the
engine with ``sync_weights``) to answer "ok" and stop, so the episode steps the env instead of ending every reply at the token
limit. Then the checks are about plumbing, not luck: the rollout's token ids are exactly
the chat-template ids of each step's messages, completions decode to the recorded text,
and the sampling logprobs match a forward pass of the same model.
"""

from __future__ import annotations

import math

import pytest
import torch

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.inference.sampling import SamplingConfig
from ludic.interaction import SingleAgentSyncProtocol
from ludic.parsers import ParseResult
from ludic.types import StepOutcome

pytestmark = pytest.mark.integration

TURNS = 3


class SayOkEnv(SingleAgentEnv):
    """Three turns; each asks for "ok" and pays 1.0 when the action is exactly "ok"."""

    def __init__(self) -> None:
        self.turn = 0
        self.actions: list[str] = []

    def env_reset(self, *, seed=None):
        self.turn = 0
        return self.env_current_obs(), {}

    def env_current_obs(self):
        return f"Turn {self.turn}: say ok."

    def env_step(self, action):
        self.actions.append(action)
        self.turn += 1
        done = self.turn >= TURNS
        reward = 1.0 if action == "ok" else 0.0
        return StepOutcome(self.env_current_obs(), reward, False, done, {"turn": self.turn})


def plain_parser(text: str) -> ParseResult:
    return ParseResult(action=text.strip(), reward=0.5)


def _dialog(answer: str = "ok") -> list[dict[str, str]]:
    msgs = []
    for k in range(TURNS):
        msgs += [{"role": "user", "content": f"Turn {k}: say ok."}, {"role": "assistant", "content": answer}]
    return msgs


def _teach_ok(model, tokenizer, max_steps: int = 800) -> None:
    """Memorise the 'ok' dialog (LM loss on the whole sequence): ~150 AdamW steps, ~3 s on CPU."""
    ids = tokenizer.apply_chat_template(_dialog(), tokenize=True, return_dict=False)
    x = torch.tensor([list(ids)])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(max_steps):
        loss = model(input_ids=x, labels=x).loss
        if loss.item() < 0.005:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert loss.item() < 0.005, f"the tiny model did not memorise the dialog (loss {loss.item():.3f})"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """The embedded engine serving a tiny model taught to say "ok" (pushed via sync_weights)."""
    from transformers import AutoModelForCausalLM

    from ludic.inference import TransformersChatClient
    from ludic.testing import build_tiny_model

    torch.manual_seed(0)
    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    client = TransformersChatClient(str(path), model_name="tiny")
    trained = AutoModelForCausalLM.from_pretrained(str(path))
    _teach_ok(trained, client.tokenizer)
    client.sync_weights({k: v.detach().clone() for k, v in trained.state_dict().items()})
    yield client
    client.close()


async def _episode(client):
    agent = Agent(
        client=client,
        model="tiny",
        ctx=FullDialog(),
        parser=plain_parser,
        sampling=SamplingConfig(temperature=1.0, max_tokens=8),
    )
    env = SayOkEnv()
    (rollout,) = await SingleAgentSyncProtocol(agent=agent).run(
        env=env, max_steps=5, env_seed=0, sampling_seed=0
    )
    return rollout, env


async def test_episode_steps_and_rewards(client):
    rollout, env = await _episode(client)
    assert env.actions == ["ok", "ok", "ok"]
    assert [s.action for s in rollout.steps] == ["ok", "ok", "ok"]
    assert [s.reward for s in rollout.steps] == [1.5, 1.5, 1.5]
    assert [s.prev_obs for s in rollout.steps] == ["Turn 0: say ok.", "Turn 1: say ok.", "Turn 2: say ok."]
    assert [s.next_obs for s in rollout.steps] == ["Turn 1: say ok.", "Turn 2: say ok.", None]
    assert [s.terminated for s in rollout.steps] == [False, False, True]
    assert all(s.info["parse_error"] is False and s.info["finish_reason"] == "stop" for s in rollout.steps)
    assert [s.info["policy_version"] for s in rollout.steps] == [1, 1, 1]
    assert rollout.meta == {"agent_id": "agent_0", "episode_truncated": False, "truncation_reason": None}


async def test_trace_ids_are_the_chat_template_ids_and_decode_to_the_text(client):
    rollout, _ = await _episode(client)
    tok = client.tokenizer
    history: list[dict[str, str]] = []
    for step in rollout.steps:
        history.append({"role": "user", "content": step.prev_obs})
        expected = tok.apply_chat_template(
            history, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert step.trace.prompt_token_ids == list(expected)
        assert tok.decode(step.trace.completion_token_ids, skip_special_tokens=True) == step.action
        assert step.trace.completion_token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
        history.append({"role": "assistant", "content": step.action})


async def test_sampling_logprobs_are_finite_and_match_a_forward_pass(client):
    rollout, _ = await _episode(client)
    for step in rollout.steps:
        trace = step.trace
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in trace.completion_logprobs)
        ids = trace.prompt_token_ids + trace.completion_token_ids
        with torch.no_grad():
            logits = client.model(input_ids=torch.tensor([ids])).logits[0].float()
        logps = torch.log_softmax(logits, dim=-1)
        start = len(trace.prompt_token_ids)
        recomputed = [logps[start + i - 1, t].item() for i, t in enumerate(trace.completion_token_ids)]
        assert recomputed == pytest.approx(trace.completion_logprobs, abs=1e-4)
