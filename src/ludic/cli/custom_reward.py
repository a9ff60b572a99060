"""``[env].reward = "module:function"``: the user's own reward for the data-set env kinds.

The function is found like ``imports`` (a dotted module, or a ``.py`` path relative to the config's
folder) and bound into the env factory as ``reward_fn``, so every training and held-out episode is
scored by it while the kind keeps its split and demonstrations. :func:`reward_errors` is the dry
run's check: the kind must take a reward, the function must import and score a first row.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ludic.config import RunConfig
from ludic.registry import ENV_REGISTRY

REWARD_ARG = "reward_fn"
"""The env factory's keyword taking ``reward_fn(reply, target, row) -> float``."""


def load_reward(cfg: RunConfig) -> Callable[..., Any]:
    """The function ``[env].reward`` names (its module imported first); ValueError saying what is wrong."""
    from ludic.registry.user_modules import UserImportError, import_user_modules

    assert cfg.env.reward is not None
    module_name, _, name = cfg.env.reward.rpartition(":")
    try:
        (module,) = import_user_modules([module_name], base_dir=cfg.folder)
    except UserImportError as exc:
        raise ValueError(str(exc).removeprefix("imports: ")) from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"module {module_name!r} has no function {name!r}")
    try:
        inspect.signature(fn).bind("reply", "target", {})
    except TypeError as exc:
        raise ValueError(f"{cfg.env.reward} must take (reply, target, row): {exc}") from None
    except ValueError:
        pass  # a builtin without a signature: its first call tells
    return fn


def env_factory(cfg: RunConfig) -> Callable[..., Any]:
    """``[env].name``'s factory, with ``[env].reward`` bound as ``reward_fn`` when the config names one."""
    factory = ENV_REGISTRY.get(cfg.env.name)
    if cfg.env.reward is None:
        return factory
    return functools.partial(factory, **{REWARD_ARG: load_reward(cfg)})


def reward_errors(cfg: RunConfig) -> list[str]:
    """The dry run's check of ``[env].reward``: a kind that takes it, a function that imports and scores
    the first training row's own answer to a finite number."""
    if cfg.env.reward is None:
        return []
    factory = ENV_REGISTRY.get(cfg.env.name)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    if REWARD_ARG not in params:
        return [f"[env].reward: env {cfg.env.name!r} takes no reward function (the data-set kind dataset_qa "
                "does; an env of your own computes its reward in its step)"]  # fmt: skip
    try:
        env = env_factory(cfg)(**cfg.env.kwargs)
        env.reset(seed=cfg.rollout.seed)
        env.env_step(str(getattr(env, "target_answer", "")))  # the row's own answer, scored by the user's function
    except Exception as exc:
        return [f"[env].reward: {cfg.env.reward}: {type(exc).__name__}: {exc}"]
    return []
