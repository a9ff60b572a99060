"""verifiers (>= 0.4, the ``verifiers.v1`` API) tasksets as Ludic envs, scored by the task's own rewards.

Needs the ``verifiers`` extra (``pip install 'ludic[verifiers]'``); it is imported only when an env is built.

Design: Ludic's own agent answers; verifiers scores. A verifiers ``Env`` reaches the model through an
OpenAI-compatible client and records what comes back; Ludic's chat route re-renders the conversation as
text, so a trainer fed from there could not rely on exact ids. Here the agent samples through Ludic's
client (exact prompt ids, completion ids and sampling log-probs on the step's ``TokenTrace``) and the
adapter hands verifiers a ``Trace`` holding the task's prompt and that reply, then runs the task's own
``score`` (its ``@reward`` methods, plugged rewards and judges, weighted as verifiers weights them).
That is the env's own episode only for a plain ``SingleAgentEnv`` and a tool-less task; anything else
(an ``Env`` with its own ``run()``, tools, several turns) is played unchanged by the ``verifiers_episode``
protocol (``ludic.interaction.verifiers_episode``), and refused here when a task is answered.

What is refused at build time, with the reason: tasks that need a container or a runtime to score
(``NEEDS_CONTAINER``, rewards taking ``runtime``), an unbounded taskset without ``max_tasks``, and
prompts of several messages. An empty reply is scored like any other (``info["empty_reply"]``), so an
aborted answer is counted and never an empty rollout; a scorer that raises, or a reward that is not a
finite number, is an episode failure naming the task (the rollout engine counts it; nothing trains on it).

Demonstrations (``[sft] from_env = true``): tasks whose data carry a reference answer (the ``answer`` field,
verifiers' own convention, e.g. its reference judge's ``answer_field``; another via ``answer_field``) are
demonstrated as prompt -> that answer.
"""

from __future__ import annotations

import inspect
import json
import math
import random
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal

from ludic.envs.dataset_rows import split_rows
from ludic.envs.demonstrations import Demonstration
from ludic.envs.single_agent_env import SingleAgentEnv
from ludic.types import Info, Obs, StepOutcome

EXTRA = "verifiers"


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ImportError(
            f"the verifiers env needs the {EXTRA!r} extra (verifiers >= 0.4): pip install 'ludic[{EXTRA}]'"
        ) from exc
    return vf


def load_tasks(source: Any, *, max_tasks: int | None = None, offline: bool = True) -> tuple[Any, ...]:
    """The tasks of a verifiers ``Env`` (its seed taskset) or ``Taskset``; with ``offline``, checked to
    score with no runtime (the single-reply path)."""
    vf = _vf()
    taskset = source.taskset if isinstance(source, vf.Env) else source
    if not isinstance(taskset, vf.Taskset):
        raise TypeError(f"verifiers env: expected a verifiers.v1 Env or Taskset, got {type(source).__name__}")
    if max_tasks is not None:
        taskset = taskset.take(max_tasks)
    elif getattr(taskset, "INFINITE", False):
        raise ValueError(f"verifiers env: {type(taskset).__name__} is infinite; set max_tasks")
    tasks = tuple(taskset)
    if not tasks:
        raise ValueError(f"verifiers env: {type(taskset).__name__} yielded no tasks")
    if offline:
        _check_offline(tasks[0])
    return tasks


def _check_offline(task: Any) -> None:
    """Ludic scores in-process with no sandbox: a task that needs one is refused, not silently unscored."""
    name = type(task).__name__
    if getattr(task, "NEEDS_CONTAINER", False):
        raise ValueError(f"verifiers env: task {name} needs a container, which this adapter does not run")
    for fn in (*task.hooks("reward"), *task.hooks("metric")):
        param = inspect.signature(fn).parameters.get("runtime")
        if param is not None and param.default is inspect.Parameter.empty:
            raise ValueError(
                f"verifiers env: {name}.{fn.__name__} needs a runtime to score, which this adapter does not run"
            )


@lru_cache(maxsize=8)
def _tasks_by_id(taskset: str, config_json: str, max_tasks: int | None) -> tuple[Any, ...]:
    vf = _vf()
    config = vf.TasksetConfig(id=taskset, **json.loads(config_json))
    return load_tasks(vf.load_taskset(config), max_tasks=max_tasks)


def prompt_of(task: Any) -> tuple[str, str | None]:
    """(user prompt text, system prompt) of a task; a prompt of several messages is refused."""
    data = task.data
    prompt, system = data.prompt, data.system_prompt
    if prompt is None:
        raise ValueError(f"verifiers env: task {data.idx} has no prompt")
    if not isinstance(prompt, str):
        users = [m for m in prompt if m.role == "user"]
        systems = [m for m in prompt if m.role == "system"]
        if len(users) != 1 or len(prompt) != len(users) + len(systems) or len(systems) > 1:
            raise ValueError(
                f"verifiers env: task {data.idx}'s prompt has roles {[m.role for m in prompt]}; "
                "only one user message (with at most one system message) is supported"
            )
        from verifiers.v1.types import content_text

        if systems:
            system = system or content_text(systems[0].content)
        prompt = content_text(users[0].content)
    return prompt, system


class VerifiersEnv(SingleAgentEnv):
    """One verifiers task per episode (``reset(seed=s)`` asks task ``s % n`` of the split); reward = the
    task's weighted verifiers reward.

    env: a verifiers.v1 ``Env`` or ``Taskset`` object (Python), or
    taskset / taskset_config: an installed taskset id and its ``TasksetConfig`` fields (configs), or
    env_config: a verifiers ``EnvConfig`` as a mapping (``{"taskset": {"id": ...}, "agent": {...}}``).
    An ``Env`` (object or ``env_config``) is kept as ``vf_env``: the ``verifiers_episode`` protocol
    runs it unchanged (``ludic.interaction.verifiers_episode``); without that protocol a task is one reply.
    max_tasks: take the first ``max_tasks`` tasks (needed for an infinite taskset).
    split: "train" or "eval"; held_out_fraction (with split_seed): the seeded share of tasks held out.
    answer_field: the task data field holding a reference answer, for :meth:`demonstrations`.
    Step info: ``rewards`` / ``metrics`` (verifiers' per-name values), ``task_idx``, ``task_key``,
    ``empty_reply``.
    """

    def __init__(
        self,
        env: Any = None,
        *,
        env_config: Mapping[str, Any] | None = None,
        taskset: str | None = None,
        taskset_config: Mapping[str, Any] | None = None,
        max_tasks: int | None = None,
        split: Literal["train", "eval"] = "train",
        held_out_fraction: float | None = None,
        split_seed: int = 0,
        answer_field: str = "answer",
    ) -> None:
        if sum(x is not None for x in (env, env_config, taskset)) != 1:
            raise ValueError("verifiers env: give exactly one of env (an object), env_config or taskset (an id)")
        if split not in ("train", "eval"):
            raise ValueError(f"verifiers env: split must be 'train' or 'eval', got {split!r}")
        if env_config is not None:
            env = _load_env(env_config)
        self.vf_env: Any = env if env is not None and isinstance(env, _vf().Env) else None
        if env is not None:
            tasks = load_tasks(env, max_tasks=max_tasks, offline=self.vf_env is None)
        else:
            tasks = _tasks_by_id(taskset, json.dumps(dict(taskset_config or {}), sort_keys=True), max_tasks)
        self.tasks = _split(tasks, split, held_out_fraction, split_seed)
        systems = {prompt_of(t)[1] for t in self.tasks}
        self._shared_system = systems.pop() if len(systems) == 1 else None
        self.task: Any = self.tasks[0]
        self.answer_field = answer_field
        self._obs: Obs = ""
        self._done = False

    @property
    def suggested_sysprompt(self) -> str | None:
        return self._shared_system

    def env_reset(self, *, seed: int | None = None) -> tuple[Obs, Info]:
        self.task = self.tasks[(seed or 0) % len(self.tasks)]
        self._obs = self._observation(self.task)
        self._done = False
        return self._obs, {"task_idx": self.task.data.idx, "task_key": self.task.key}

    def _observation(self, task: Any) -> str:
        prompt, system = prompt_of(task)
        # A per-task system prompt that differs between tasks cannot be the agent's system prompt
        # (the protocol reads it before reset), so it leads the observation instead.
        return prompt if system == self._shared_system or not system else f"{system}\n\n{prompt}"

    def demonstrations(self, n: int, seed: int) -> list[Demonstration]:
        """``n`` tasks of this split (a seeded shuffle, cycled) whose data hold a reference answer in
        ``answer_field``: the observation the agent gets -> that answer (a list: its first item)."""
        if n < 1:
            raise ValueError(f"verifiers env: demonstrations: n must be >= 1, got {n}")
        if self.vf_env is not None:
            try:
                _check_single_reply(self.vf_env, self.tasks[0])
            except RuntimeError as exc:
                raise ValueError(f"verifiers env: no demonstrations of one reply: {exc}") from exc
        answered = [(t, a) for t in self.tasks if (a := _answer_of(t.data, self.answer_field))]
        if not answered:
            raise ValueError(
                f"verifiers env: no task of {type(self.tasks[0].data).__name__} carries a reference answer in "
                f"{self.answer_field!r} (its fields: {sorted(type(self.tasks[0].data).model_fields)}); set "
                "answer_field, or give [sft] a demonstrations file"
            )
        order = list(range(len(answered)))
        random.Random(seed).shuffle(order)
        picks = (answered[order[i % len(order)]] for i in range(n))
        return [Demonstration(self._observation(task), answer) for task, answer in picks]

    def env_current_obs(self) -> Obs:
        return self._obs

    def env_step(self, action: str) -> StepOutcome:
        raise RuntimeError("VerifiersEnv scores asynchronously: the protocols call astep")

    async def env_astep(self, action: str) -> StepOutcome:
        if self._done:
            raise RuntimeError("VerifiersEnv: the task was already answered; call reset()")
        if self.vf_env is not None:
            _check_single_reply(self.vf_env, self.task)
        self._done = True
        trace = await self._scored_trace(action)
        reward = trace.reward
        if not math.isfinite(reward):
            raise RuntimeError(
                f"verifiers env: task {self.task.data.idx} scored a non-finite reward {reward}"
            )
        info = {
            "rewards": {k: (r.score if r is not None else None) for k, r in trace.rewards.items()},
            "metrics": dict(trace.metrics),
            "task_idx": self.task.data.idx,
            "task_key": self.task.key,
            "empty_reply": not action.strip(),
        }
        return StepOutcome(obs=None, reward=float(reward), truncated=False, terminated=True, info=info)

    async def _scored_trace(self, action: str) -> Any:
        """A verifiers Trace of this episode (prompt + the agent's reply), scored by the task itself."""
        vf = _vf()
        from verifiers.v1.graph import MessageNode

        task, (prompt, system) = self.task, prompt_of(self.task)
        trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=vf.AgentInfo(config=vf.AgentConfig(), name="ludic"),
        )
        messages = ([vf.SystemMessage(content=system)] if system else []) + [vf.UserMessage(content=prompt)]
        for i, message in enumerate(messages):
            trace.nodes.append(MessageNode(parent=i - 1 if i else None, message=message))
        reply = vf.AssistantMessage(content=action)
        trace.nodes.append(MessageNode(parent=len(messages) - 1, message=reply, sampled=True))
        trace.is_completed = trace.ok = True
        try:
            await task.score(trace)
        except Exception as exc:  # a crashed verifier is a named failure, never a silent 0
            raise RuntimeError(
                f"verifiers env: scoring task {task.data.idx} ({type(task).__name__}) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return trace


def _answer_of(data: Any, field: str) -> str | None:
    """A task's reference answer as text (a list: its first item; numbers as written), or None."""
    value = getattr(data, field, None)
    if value is None and getattr(data, "model_extra", None):
        value = data.model_extra.get(field)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if isinstance(value, bool) or value is None:
        return None
    text = str(value) if isinstance(value, (str, int, float)) else None
    return text if text and text.strip() else None


def _load_env(config: Mapping[str, Any]) -> Any:
    vf = _vf()
    return vf.load_environment(vf.resolve_env_config(dict(config)))


def _check_single_reply(vf_env: Any, task: Any) -> None:
    """Scoring one reply is the env's own episode only for a plain SingleAgentEnv and a tool-less task."""
    vf, kind = _vf(), type(vf_env).__name__
    if type(vf_env).run is not vf.SingleAgentEnv.run:
        raise RuntimeError(
            f"verifiers env: {kind} has its own run(); one reply would not be its episode. "
            "Play it with the verifiers_episode protocol (ludic.interaction.verifiers_episode), which runs it unchanged"
        )
    if type(task).toolsets(task.config) or vf_env.taskset.toolsets(vf_env.taskset.config):
        raise RuntimeError(
            f"verifiers env: task {task.data.idx} offers tools; one reply would drop them. "
            "Play it with the verifiers_episode protocol (ludic.interaction.verifiers_episode)"
        )
    _check_offline(task)


def _split(tasks: Sequence[Any], split: str, fraction: float | None, seed: int) -> tuple[Any, ...]:
    if fraction is None:
        if split == "eval":
            raise ValueError(
                "verifiers env: split 'eval' needs held-out tasks: set held_out_fraction (e.g. 0.1)"
            )
        return tuple(tasks)
    train, held = split_rows(tasks, fraction, seed)
    return tuple(train if split == "train" else held)
