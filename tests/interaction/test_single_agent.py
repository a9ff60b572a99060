import asyncio

import pytest

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.interaction import SingleAgentProtocol, SingleAgentSyncProtocol
from ludic.parsers import xml_tag_parser
from ludic.testing.scripted_client import ScriptedChatClient
from ludic.types import StepOutcome


class CountEnv(SingleAgentEnv):
    """Reach ``target`` by saying numbers; reward 1 on reaching it, else 0; obs shows the count."""

    def __init__(self, target=2, truncate_at=None):
        self.target = target
        self.truncate_at = truncate_at
        self.calls = []
        self.n = 0

    @property
    def suggested_sysprompt(self):
        return "Count."

    def env_reset(self, *, seed=None):
        self.n = 0 if seed is None else seed
        return self.env_current_obs(), {"start": self.n}

    def env_current_obs(self):
        return f"n={self.n}"

    def env_step(self, action):
        self.calls.append(action)
        self.n = int(action)
        done = self.n >= self.target
        trunc = self.truncate_at is not None and len(self.calls) >= self.truncate_at
        return StepOutcome(
            obs=self.env_current_obs(),
            reward=1.0 if done else 0.0,
            truncated=trunc and not done,
            terminated=done,
            info={"n": self.n},
        )


def _protocol(replies, **kw):
    client = ScriptedChatClient(replies, policy_version=3)
    agent = Agent(
        client=client,
        model="m",
        ctx=FullDialog(),
        parser=xml_tag_parser("n", success_reward=0.1, error_reward=-1.0),
        **kw,
    )
    return SingleAgentProtocol(agent=agent), client


async def test_episode_steps_rewards_and_obs_chain():
    proto, _ = _protocol(["<n>1</n>", "<n>2</n>"])
    env = CountEnv()
    (rollout,) = await proto.run(env=env, max_steps=5)
    assert [s.index for s in rollout.steps] == [0, 1]
    assert [s.prev_obs for s in rollout.steps] == ["n=0", "n=1"]
    assert [s.next_obs for s in rollout.steps] == ["n=1", None]
    assert [s.reward for s in rollout.steps] == [0.1, 1.1]
    assert [s.terminated for s in rollout.steps] == [False, True]
    assert rollout.steps[1].info["parsed_action"] == "2"
    assert rollout.steps[1].info["parse_error"] is False
    assert rollout.steps[1].info["policy_version"] == 3
    assert rollout.steps[1].info["finish_reason"] == "stop"
    assert rollout.steps[1].info["n"] == 2
    assert rollout.steps[1].info["final_obs"] == "n=2"
    assert rollout.steps[1].trace.completion_token_ids == list(b"<n>2</n>")
    assert rollout.meta == {"agent_id": "agent_0", "episode_truncated": False, "truncation_reason": None}
    assert env.calls == ["1", "2"]


async def test_parse_failure_is_a_synthetic_step_and_env_is_not_stepped():
    proto, client = _protocol(["two", "<n>2</n>"])
    env = CountEnv()
    (rollout,) = await proto.run(env=env, max_steps=5)
    bad = rollout.steps[0]
    assert (bad.action, bad.reward, bad.terminated, bad.truncated) == ("two", -1.0, False, False)
    assert bad.info["parse_error"] is True and bad.info["parsed_action"] is None
    assert bad.next_obs.startswith("Invalid format. Expected <n>...</n>")
    assert env.calls == ["2"]
    assert rollout.steps[1].prev_obs == bad.next_obs
    # the parser's obs was fed back to the agent as a user message
    assert client.requests[1].messages[-2:] == [
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": bad.next_obs},
    ]


async def test_finish_reason_length_with_incomplete_reward_is_a_parse_failure_not_truncation():
    proto, _ = _protocol([("<n>2</n>", "length"), "<n>2</n>"], incomplete_reward=-1.0)
    env = CountEnv()
    (rollout,) = await proto.run(env=env, max_steps=5)
    assert rollout.steps[0].info["parse_error"] is True
    assert rollout.steps[0].truncated is False
    assert rollout.steps[0].info["finish_reason"] == "length"
    assert env.calls == ["2"]
    assert rollout.meta["episode_truncated"] is False


async def test_finish_reason_length_by_default_goes_to_the_parser_and_env_as_is():
    proto, _ = _protocol([("<n>2</n>", "length"), ("<n>", "length")])
    env = CountEnv(target=5)
    (rollout,) = await proto.run(env=env, max_steps=2)
    assert env.calls == ["2"]  # the cut but parsable reply was played
    assert rollout.steps[0].info["parse_error"] is False
    assert rollout.steps[0].info["finish_reason"] == "length"
    assert rollout.steps[1].info["parse_error"] is True  # unparsable: the parser's own reward, not -1
    assert rollout.steps[1].reward == rollout.steps[1].info["parser_reward"]


async def test_max_steps_cut_truncates_the_last_step():
    proto, _ = _protocol(["<n>0</n>", "<n>1</n>"])
    (rollout,) = await proto.run(env=CountEnv(target=9), max_steps=2)
    last = rollout.steps[-1]
    assert (last.truncated, last.terminated, last.next_obs) == (True, False, None)
    assert last.info["truncation_reason"] == "max_steps"
    assert rollout.meta["episode_truncated"] is True
    assert rollout.meta["truncation_reason"] == "max_steps"


async def test_env_truncation_is_reported_as_env():
    proto, _ = _protocol(["<n>0</n>"])
    (rollout,) = await proto.run(env=CountEnv(target=9, truncate_at=1), max_steps=5)
    assert rollout.steps[0].next_obs is None
    assert rollout.meta["truncation_reason"] == "env"


async def test_env_sysprompt_seed_and_sampling_seed_are_used():
    proto, client = _protocol(["<n>5</n>", "<n>9</n>"])
    await proto.run(
        env=CountEnv(target=9),
        max_steps=3,
        env_seed=4,
        sampling_seed=7,
        inference=InferenceSpec(sampling=SamplingConfig(max_tokens=11)),
    )
    assert client.requests[0].messages[:2] == [
        {"role": "system", "content": "Count."},
        {"role": "user", "content": "n=4"},
    ]
    assert [r.sampling.seed for r in client.requests] == [7000, 7001]
    assert [r.sampling.max_tokens for r in client.requests] == [11, 11]


async def test_agent_system_prompt_wins_over_env_suggestion():
    client = ScriptedChatClient(["<n>2</n>"])
    agent = Agent(client=client, model="m", ctx=FullDialog(system_prompt="Mine."), parser=xml_tag_parser("n"))
    await SingleAgentSyncProtocol(agent=agent).run(env=CountEnv(), max_steps=1)
    assert client.requests[0].messages[0] == {"role": "system", "content": "Mine."}


async def test_timeout_bounds_the_whole_episode():
    class Slow(ScriptedChatClient):
        async def complete(self, request):
            await asyncio.sleep(0.03)
            return await super().complete(request)

    agent = Agent(client=Slow(["<n>0</n>"] * 50), model="m", ctx=FullDialog(), parser=xml_tag_parser("n"))
    with pytest.raises(TimeoutError, match=r"timeout_s=0\.1"):
        await SingleAgentProtocol(agent=agent).run(env=CountEnv(target=99), max_steps=50, timeout_s=0.1)


async def test_rejects_multi_agent_env_and_bad_max_steps():
    from ludic.envs.tic_tac_toe import TicTacToeEnv

    proto, _ = _protocol([])
    with pytest.raises(ValueError, match="exactly one agent id"):
        await proto.run(env=TicTacToeEnv(two_player=True), max_steps=3)
    with pytest.raises(ValueError, match="max_steps must be an int >= 1"):
        await proto.run(env=CountEnv(), max_steps=0)


async def test_request_sampling_wins_whole_over_the_agents_and_the_fallback_is_256_tokens():
    from ludic.inference import DEFAULT_MAX_TOKENS

    replies = ["<n>2</n>"] * 3
    agent_sampling = SamplingConfig(temperature=0.3, max_tokens=5)
    proto, client = _protocol(replies, sampling=agent_sampling)
    request_sampling = SamplingConfig(temperature=0.9, max_tokens=7)
    await proto.run(env=CountEnv(), max_steps=1, inference=InferenceSpec(request_sampling), sampling_seed=1)
    await proto.run(env=CountEnv(), max_steps=1)
    bare, bare_client = _protocol(replies)
    await bare.run(env=CountEnv(), max_steps=1)
    used = [r.sampling for r in client.requests] + [bare_client.requests[0].sampling]
    assert (used[0].temperature, used[0].max_tokens, used[0].seed) == (0.9, 7, 1000)  # the request's
    assert used[1] == agent_sampling  # no inference on the request: the agent's
    assert used[2].max_tokens == DEFAULT_MAX_TOKENS == 256  # neither: SamplingConfig()
