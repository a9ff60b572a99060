"""Registries: lookups by name, decorators, and KeyErrors that list the known names."""

from __future__ import annotations

import pytest

from ludic.envs.letter_repeat import LetterRepeatEnv
from ludic.registry import ALGORITHM_REGISTRY, ENV_REGISTRY, Registry, get_env


def test_register_decorator_and_lookup() -> None:
    reg: Registry = Registry("widget")

    @reg.register("double")
    def double(x: int) -> int:
        return 2 * x

    assert reg.get("double") is double
    assert reg.build("double", x=4) == 8
    assert "double" in reg
    assert reg.names() == ["double"]


def test_unknown_name_raises_key_error_listing_known_names() -> None:
    reg: Registry = Registry("widget")
    reg.register("b", int)
    reg.register("a", str)
    with pytest.raises(KeyError, match=r"unknown widget 'c'; known widgets: a, b"):
        reg.get("c")


def test_duplicate_registration_is_refused_unless_overwrite() -> None:
    reg: Registry = Registry("widget")
    reg.register("a", int)
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a", str)
    reg.register("a", str, overwrite=True)
    assert reg.get("a") is str


def test_lazy_entries_resolve_on_first_lookup() -> None:
    reg: Registry = Registry("widget")
    reg.register_lazy("join", "os.path:join")
    import os.path

    assert reg.get("join") is os.path.join
    with pytest.raises(ValueError, match="must look like 'module:attr'"):
        reg.register_lazy("bad", "os.path.join")


def test_builtin_env_registry_builds_the_quickstart_env() -> None:
    env = ENV_REGISTRY.build("letter_repeat", count=3)
    assert isinstance(env, LetterRepeatEnv)
    assert get_env("letter_repeat") is LetterRepeatEnv
    with pytest.raises(KeyError, match=r"known envs: .*letter_repeat"):
        get_env("letter-repeat")


def test_builtin_algorithm_names_cover_the_presets() -> None:
    assert {"grpo", "cispo", "gspo", "reinforce", "reinforce_baseline", "sft"} <= set(ALGORITHM_REGISTRY)


def test_every_builtin_algorithm_resolves_to_a_preset_building_an_rl_algorithm() -> None:
    import torch

    from ludic.training.algorithm import RLAlgorithm

    needs = {"distill": {"teacher": torch.nn.Linear(1, 1)}}  # the one preset with a required model
    for name in ALGORITHM_REGISTRY.names():
        algo = ALGORITHM_REGISTRY.build(name, **needs.get(name, {}))
        assert isinstance(algo, RLAlgorithm), name
    assert ALGORITHM_REGISTRY.build("grpo", group_size=4).name == "grpo"
