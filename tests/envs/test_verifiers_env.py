"""verifiers (v1 API) tasksets as envs, with the real package offline: the task's own rewards score the
agent's reply, exact token ids survive, held-out tasks stay apart, and failures are named."""

from __future__ import annotations

import asyncio
import builtins
import sys

import pytest

pytest.importorskip("verifiers.v1")

import verifiers.v1 as vf

from ludic.envs.verifiers_env import VerifiersEnv
from ludic.registry import ENV_REGISTRY

WORDS = ["ab", "cd", "ef", "gh"]


class EchoData(vf.TaskData):
    answer: str = ""


class EchoTask(vf.Task[EchoData, vf.State]):
    @vf.reward(weight=0.5)
    async def exact(self, task: EchoData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)

    @vf.reward
    async def contains(self, task: EchoData, trace: vf.Trace) -> float:
        return float(task.answer in trace.last_reply)


class EchoTaskset(vf.Taskset[EchoTask]):
    def load(self):
        for w in WORDS:
            yield EchoTask(
                EchoData(prompt=f"repeat {w}", answer=w, system_prompt="Be brief."), self.config.task
            )


class CrashTask(EchoTask):
    @vf.reward
    async def broken(self, task: EchoData, trace: vf.Trace) -> float:
        raise ZeroDivisionError("boom")


class CrashTaskset(vf.Taskset[CrashTask]):
    def load(self):
        yield CrashTask(EchoData(prompt="repeat ab", answer="ab"), self.config.task)


def _taskset(cls: type = EchoTaskset) -> vf.Taskset:
    return cls(vf.TasksetConfig(id="echo"))


def _answer(env: VerifiersEnv, seed: int, reply: str):
    env.reset(seed=seed)
    return asyncio.run(env.astep({"agent_0": reply}))["agent_0"]


def test_reward_is_the_tasks_weighted_verifiers_reward() -> None:
    env = VerifiersEnv(_taskset())
    assert env.suggested_sysprompt == "Be brief."
    obs, info = env.reset(seed=1)["agent_0"]
    assert (obs, info["task_idx"]) == ("repeat cd", 1)
    right = _answer(env, 1, "cd")
    assert right.reward == 1.5 and right.terminated
    assert right.info["rewards"] == {"exact": 1.0, "contains": 1.0}
    assert _answer(env, 1, "so cd").reward == 1.0  # contains only
    assert _answer(env, 1, "xy").reward == 0.0


def test_an_env_object_is_run_through_its_taskset() -> None:
    class Holder(vf.Env):  # stands for any built Env: the adapter reads its seed taskset
        def __init__(self) -> None:
            self.taskset = _taskset()

        async def run(self, task, agents) -> None:  # pragma: no cover - not called
            raise AssertionError

    env = VerifiersEnv(Holder())
    assert len(env.tasks) == len(WORDS)


def test_empty_reply_is_scored_and_flagged_not_dropped() -> None:
    out = _answer(VerifiersEnv(_taskset()), 0, "")
    assert (out.reward, out.info["empty_reply"], out.terminated) == (0.0, True, True)


def test_a_scorer_that_raises_is_an_error_naming_the_task() -> None:
    env = VerifiersEnv(_taskset(CrashTaskset))
    with pytest.raises(RuntimeError, match=r"scoring task 0 \(CrashTask\) raised .*boom"):
        _answer(env, 0, "ab")


def test_held_out_tasks_are_never_training_tasks() -> None:
    train = VerifiersEnv(_taskset(), held_out_fraction=0.25, split_seed=0)
    held = VerifiersEnv(_taskset(), held_out_fraction=0.25, split_seed=0, split="eval")
    assert len(train.tasks) == 3 and len(held.tasks) == 1
    assert not {t.key for t in train.tasks} & {t.key for t in held.tasks}
    with pytest.raises(ValueError, match="held_out_fraction"):
        VerifiersEnv(_taskset(), split="eval")


def test_tasks_needing_a_runtime_are_refused() -> None:
    class BoxTask(EchoTask):
        NEEDS_CONTAINER = True

    class BoxTaskset(vf.Taskset[BoxTask]):
        def load(self):
            yield BoxTask(EchoData(prompt="p", answer="a"), self.config.task)

    with pytest.raises(ValueError, match="needs a container"):
        VerifiersEnv(_taskset(BoxTaskset))


def test_registered_kind_builds_from_an_installed_taskset_id(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    module = types.ModuleType("ludic_test_echo_taskset")
    module.EchoTaskset = EchoTaskset
    module.__all__ = ["EchoTaskset"]
    monkeypatch.setitem(sys.modules, "ludic_test_echo_taskset", module)
    env = ENV_REGISTRY.build("verifiers", taskset="ludic_test_echo_taskset", max_tasks=2)
    assert [t.data.answer for t in env.tasks] == ["ab", "cd"]
    assert _answer(env, 3, "cd").reward == 1.5


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_verifiers(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("verifiers"):
            raise ImportError("No module named 'verifiers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_verifiers)
    with pytest.raises(ImportError, match=r"pip install 'ludic\[verifiers\]'"):
        VerifiersEnv(taskset="anything")


def test_the_agents_exact_tokens_reach_the_step() -> None:
    """Ludic's agent answers a verifiers task: the step keeps the sampled ids and log-probs."""
    from ludic.agents import Agent
    from ludic.context import FullDialog
    from ludic.inference import TransformersChatClient
    from ludic.inference.sampling import SamplingConfig
    from ludic.interaction import SingleAgentProtocol
    from ludic.parsers import ParseResult
    from ludic.testing import tiny_model_path

    client = TransformersChatClient(str(tiny_model_path()))
    agent = Agent(
        client=client, model="tiny", ctx=FullDialog(), tokenizer=client.tokenizer,
        parser=lambda text: ParseResult(action=text, reward=0.0, obs=None),
        sampling=SamplingConfig(temperature=1.0, max_tokens=6),
    )  # fmt: skip
    env = VerifiersEnv(_taskset())
    (rollout,) = asyncio.run(
        SingleAgentProtocol(agent).run(env=env, max_steps=1, env_seed=2, sampling_seed=0)
    )
    (step,) = rollout.steps
    assert step.trace is not None and len(step.trace.completion_token_ids) >= 1
    assert len(step.trace.completion_logprobs) == len(step.trace.completion_token_ids)
    prompt_text = client.tokenizer.decode(step.trace.prompt_token_ids)
    assert "Be brief." in prompt_text and "repeat ef" in prompt_text
    assert step.reward == step.info["rewards"]["exact"] * 0.5 + step.info["rewards"]["contains"]


def test_tasks_with_a_reference_answer_are_demonstrated_as_the_agent_sees_them() -> None:
    from ludic.envs.demonstrations import ProvidesDemonstrations

    env = VerifiersEnv(_taskset(), held_out_fraction=0.25)
    assert isinstance(env, ProvidesDemonstrations)  # was: no demonstrations(), so [sft] from_env failed
    demos = env.demonstrations(6, seed=0)
    assert len(demos) == 6 and demos == env.demonstrations(6, seed=0)
    held_out = {t.data.answer for t in VerifiersEnv(_taskset(), split="eval", held_out_fraction=0.25).tasks}
    for d in demos:
        assert d.prompt == f"repeat {d.answer}" and d.answer not in held_out  # training tasks only
    assert env.suggested_sysprompt == "Be brief."  # the shared system prompt stays the agent's own


def test_tasks_without_an_answer_field_are_named() -> None:
    with pytest.raises(ValueError, match=r"carries a reference answer in 'target' \(its fields: .*'answer'"):
        VerifiersEnv(_taskset(), answer_field="target").demonstrations(2, seed=0)
