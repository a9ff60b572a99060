"""verifiers (0.4) Envs played unchanged by VerifiersEpisodeProtocol, with the real package, its real harness
program (in verifiers' subprocess runtime, on this venv's Python: no uv, offline), real MCP tool servers and
Ludic's real server on the tiny model: every model call of a trainable run recorded exactly, the task's own
reward on the last step, a modelled user never trained, failures named and counted by the rollout engine."""

from __future__ import annotations

import asyncio
import itertools
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from ludic.envs.verifiers_env import VerifiersEnv
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.interaction.verifiers_episode import VerifiersEpisodeFailed, VerifiersEpisodeProtocol
from ludic.testing import tiny_model_path
from ludic.testing.server_process import running_server
from ludic.training.batching import RolloutEngine
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest

TASKS = Path(__file__).parents[1] / "envs" / "vf_tasks"  # taskset modules, imported by id (tool servers: python -m)
SUBPROCESS = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
INFERENCE = InferenceSpec(sampling=SamplingConfig(temperature=1.0, max_tokens=8))


@pytest.fixture(scope="module")
def server() -> str:
    with running_server(tiny_model_path()) as url:
        yield url + "/v1"


@pytest.fixture(autouse=True)
def task_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TASKS))
    monkeypatch.setenv("PYTHONPATH", str(TASKS))


def _single(taskset: str) -> VerifiersEnv:
    return VerifiersEnv(env_config={"taskset": {"id": taskset}, "agent": SUBPROCESS})


def _play(server: str, env: VerifiersEnv, max_steps: int = 4, **kwargs):
    protocol = VerifiersEpisodeProtocol(base_url=server, harness_python=sys.executable, **kwargs)
    return asyncio.run(
        protocol.run(env=env, max_steps=max_steps, env_seed=1, sampling_seed=0, inference=INFERENCE)
    )


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_path()))


def test_single_agent_env_runs_unchanged_and_its_call_is_recorded_exactly(server: str) -> None:
    env = _single("vf_echo")
    assert type(env.vf_env).__name__ == "SingleAgentEnv"
    (rollout,) = _play(server, env)
    (step,) = rollout.steps
    assert rollout.meta["agent_id"] == "agent" and rollout.meta["num_calls"] == 1
    prompt = _tokenizer().decode(step.trace.prompt_token_ids)
    assert "Be brief." in prompt and "repeat cd" in prompt  # the task's system prompt and prompt (seed 1)
    assert len(step.trace.completion_token_ids) == len(step.trace.completion_logprobs) == 8
    assert step.info["sampling_temperature"] == 1.0 and step.terminated
    scores = step.info["vf_rewards"]
    assert set(scores) == {"contains", "replied"}
    assert step.reward == 0.5 * scores["contains"] + scores["replied"]  # verifiers' weighted reward
    assert step.truncated and step.info["truncation_reason"] == "length"  # cut at max_tokens, still scored


@pytest.mark.slow
def test_user_sim_env_trains_the_assistant_on_every_turn_and_never_the_user(server: str) -> None:
    user = {**SUBPROCESS, "max_turns": 3}
    env = VerifiersEnv(
        env_config={"id": "user-sim", "taskset": {"id": "vf_echo"}, "assistant": SUBPROCESS, "user": user}
    )
    (rollout,) = _play(server, env, max_steps=6)  # the user's runs are played, not returned
    assert rollout.meta["agent_id"] == "assistant"
    steps = rollout.steps
    assert len(steps) == 3 and [s.info["call_index"] for s in steps] == [0, 1, 2]
    for prev, step in itertools.pairwise(steps):  # each turn extends the last call's exact ids
        head = [*prev.trace.prompt_token_ids, *prev.trace.completion_token_ids]
        assert step.trace.prompt_token_ids[: len(head)] == head and "sequence_break" not in step.info
    assert steps[-1].info["vf_metrics"] == {"user_turns": 3.0}  # the env's finalize() ran
    assert [s.reward for s in steps[:-1]] == [0.0, 0.0] and steps[-1].terminated


@pytest.mark.slow
def test_a_task_with_an_mcp_tool_is_played_with_the_tool_offered(server: str) -> None:
    (rollout,) = _play(server, _single("vf_tools"))
    (step,) = rollout.steps
    assert "Add two integers." in _tokenizer().decode(step.trace.prompt_token_ids)  # the tool, in the prompt
    assert set(step.info["vf_rewards"]) == {"correct"}


def test_single_reply_mode_refuses_an_env_with_its_own_run() -> None:
    env = VerifiersEnv(env_config={"id": "user-sim", "taskset": {"id": "vf_echo"}})
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match=r"UserSimEnv has its own run.*verifiers_episode"):
        asyncio.run(env.astep({"agent_0": "ab"}))


@pytest.mark.slow
def test_failures_are_named_counted_and_never_trained(server: str) -> None:
    with pytest.raises(
        VerifiersEpisodeFailed, match="TaskError: task BrokenTask scoring: ZeroDivisionError: boom"
    ):
        _play(server, _single("vf_broken"))
    with pytest.raises(VerifiersEpisodeFailed, match="agent run 'agent' made no model call"):
        _play(server, _single("vf_silent"))  # a @vf.stop hook ends the run before its first call
    with pytest.raises(VerifiersEpisodeFailed, match=r"exceeded timeout_s=0\.2"):
        _play(server, _single("vf_echo"), timeout_s=0.2)

    engine = RolloutEngine(
        env_registry={"vf": _single},
        protocol_registry={
            "episode": lambda: VerifiersEpisodeProtocol(base_url=server, harness_python=sys.executable)
        },
        max_failure_frac=1.0,
    )
    requests = [
        RolloutRequest(EnvSpec("vf", {"taskset": t}), ProtocolSpec("episode"))
        for t in ("vf_echo", "vf_broken")
    ]
    rollouts = asyncio.run(engine.generate_rollouts(requests=requests, max_steps=4, include_failed=True))
    assert [bool(r.meta.get("failed")) for r in rollouts] == [False, True]
    assert rollouts[1].meta["error"]["type"] == "VerifiersEpisodeFailed" and not rollouts[1].steps


def test_the_config_kind_needs_a_server_and_names_the_setting() -> None:
    from types import SimpleNamespace

    from ludic.interaction.verifiers_episode import verifiers_episode_protocol
    from ludic.registry import PROTOCOL_REGISTRY

    assert PROTOCOL_REGISTRY.get("verifiers_episode") is verifiers_episode_protocol
    with pytest.raises(ValueError, match=r'backend = "server"'):
        verifiers_episode_protocol(agent=SimpleNamespace(client=object(), model="m"))
    served = SimpleNamespace(client=SimpleNamespace(base_url="http://127.0.0.1:9/"), model="tiny")
    protocol = verifiers_episode_protocol(agent=served)
    assert (protocol.base_url, protocol.model) == ("http://127.0.0.1:9/v1", "tiny")


def test_a_plain_ludic_env_is_refused_by_name() -> None:
    from ludic.envs.letter_repeat import LetterRepeatEnv

    protocol = VerifiersEpisodeProtocol(base_url="http://127.0.0.1:9/v1")
    with pytest.raises(TypeError, match="LetterRepeatEnv without one"):
        asyncio.run(protocol.run(env=LetterRepeatEnv(), max_steps=1))
