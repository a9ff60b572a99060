"""Name -> factory registries, so a run is described by names and keyword arguments.

Four registries: environments, agent harnesses (agent + context + parser), interaction
protocols and algorithm presets. Built-ins are registered lazily as ``"module:attr"`` strings
so importing this package imports nothing heavy; they resolve on first lookup.

Factory call conventions (what ``ludic train`` relies on):

- env: ``factory(**kwargs) -> LudicEnv``
- harness: ``factory(*, client, model, tokenizer=None, sampling=None, **kwargs) -> Agent``
- protocol: ``factory(*, agent, **kwargs) -> InteractionProtocol``, or ``factory(*, new_agent, **kwargs)``
  for a protocol with several agents (``new_agent()`` builds a fresh one of the run's harness)
- algorithm: ``factory(**kwargs) -> RLAlgorithm`` (the ``make_*`` presets)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ludic.registry.core import Registry

F = TypeVar("F", bound=Callable[..., Any])

ENV_REGISTRY: Registry[Callable[..., Any]] = Registry("env")
HARNESS_REGISTRY: Registry[Callable[..., Any]] = Registry("harness", "harnesses")
PROTOCOL_REGISTRY: Registry[Callable[..., Any]] = Registry("protocol")
ALGORITHM_REGISTRY: Registry[Callable[..., Any]] = Registry("algorithm")


def register_env(name: str) -> Callable[[F], F]:
    """Decorator: ``@register_env("my_env")`` on a class or factory returning a LudicEnv."""
    return ENV_REGISTRY.register(name)


def register_harness(name: str) -> Callable[[F], F]:
    """Decorator for ``factory(*, client, model, tokenizer=None, sampling=None, **kw) -> Agent``."""
    return HARNESS_REGISTRY.register(name)


def register_protocol(name: str) -> Callable[[F], F]:
    """Decorator for ``factory(*, agent, **kw) -> InteractionProtocol``."""
    return PROTOCOL_REGISTRY.register(name)


def register_algorithm(name: str) -> Callable[[F], F]:
    """Decorator for an algorithm preset ``factory(**kw) -> RLAlgorithm``."""
    return ALGORITHM_REGISTRY.register(name)


def get_env(name: str) -> Callable[..., Any]:
    return ENV_REGISTRY.get(name)


def get_harness(name: str) -> Callable[..., Any]:
    return HARNESS_REGISTRY.get(name)


def get_protocol(name: str) -> Callable[..., Any]:
    return PROTOCOL_REGISTRY.get(name)


def get_algorithm(name: str) -> Callable[..., Any]:
    return ALGORITHM_REGISTRY.get(name)


# Built-ins, resolved on first lookup.
for _name in ("grpo", "cispo", "gspo", "reinforce", "reinforce_baseline", "scalerl", "sft"):
    ALGORITHM_REGISTRY.register_lazy(_name, f"ludic.training.presets:make_{_name}")
ALGORITHM_REGISTRY.register_lazy("distill", "ludic.training.reference.distill:make_distill")

ENV_REGISTRY.register_lazy("letter_repeat", "ludic.envs.letter_repeat:LetterRepeatEnv")
ENV_REGISTRY.register_lazy("tic_tac_toe", "ludic.envs.tic_tac_toe:TicTacToeEnv")
ENV_REGISTRY.register_lazy("dataset_qa", "ludic.envs.dataset_rows:dataset_qa_env")
ENV_REGISTRY.register_lazy("reasoning_gym", "ludic.envs.reasoning_gym_env:ReasoningGymEnv")
ENV_REGISTRY.register_lazy("verifiers", "ludic.envs.verifiers_env:VerifiersEnv")
ENV_REGISTRY.register_lazy("textarena", "ludic.envs.textarena_env:TextArenaEnv")
HARNESS_REGISTRY.register_lazy("plain", "ludic.registry.builtins:plain_harness")
HARNESS_REGISTRY.register_lazy("xml_move", "ludic.registry.builtins:xml_move_harness")
PROTOCOL_REGISTRY.register_lazy("single_agent", "ludic.registry.builtins:single_agent_protocol")
PROTOCOL_REGISTRY.register_lazy("multi_agent", "ludic.registry.builtins:multi_agent_protocol")
PROTOCOL_REGISTRY.register_lazy("openai_program", "ludic.registry.openai_program:openai_program_protocol")
PROTOCOL_REGISTRY.register_lazy("verifiers_episode", "ludic.interaction.verifiers_episode:verifiers_episode_protocol")

__all__ = [
    "ALGORITHM_REGISTRY",
    "ENV_REGISTRY",
    "HARNESS_REGISTRY",
    "PROTOCOL_REGISTRY",
    "Registry",
    "get_algorithm",
    "get_env",
    "get_harness",
    "get_protocol",
    "register_algorithm",
    "register_env",
    "register_harness",
    "register_protocol",
]
