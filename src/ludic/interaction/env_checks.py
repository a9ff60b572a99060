"""Checks on what an env hands back, so a misbehaving env fails only its own episode, named.

Without them a reward ``"1.5"`` is silently parsed, ``None`` fails with an unnamed TypeError, ``terminated="False"`` ends the episode (a non-empty string is true),
and an observation that is not text goes into the chat context as it is.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from ludic.types import Info, Obs, StepOutcome


def real_reward(value: Any, where: str) -> float:
    """``value`` as a float; a reward must be a real number (bools and numpy scalars count, a str or None
    does not). NaN and inf pass here: the Evaluator names them, and ``RolloutEngine.generate_batch``
    fails their episode alone (``ludic.training.batching.rollout_checks``)."""
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: reward must be a real number, got {type(value).__name__} {value!r:.80}")
    return float(value)


def finite_reward(value: Any, where: str) -> float:
    """``value`` as a float; raise unless it is a finite real number."""
    reward = real_reward(value, where)
    if not math.isfinite(reward):
        raise ValueError(f"{where}: non-finite reward {reward!r}; training cannot use it")
    return reward


def _flag(value: Any, name: str, where: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{where}: {name} must be a bool, got {type(value).__name__} {value!r:.80}")


def _info(value: Any, where: str) -> Info:
    if not isinstance(value, Mapping):
        raise TypeError(f"{where}: info must be a dict, got {type(value).__name__} {value!r:.80}")
    return dict(value)


def _obs(value: Any, where: str, *, optional: bool) -> Obs | None:
    if isinstance(value, str) or (optional and value is None):
        return value
    wanted = "a str (or None once the episode ended)" if optional else "a str"
    raise TypeError(f"{where}: observation must be {wanted}, got {type(value).__name__} {value!r:.80}")


def checked_outcome(outcome: Any, agent_id: str) -> StepOutcome:
    """The env's outcome for ``agent_id``, checked and with plain Python types."""
    where = f"env step outcome for agent {agent_id!r}"
    if not isinstance(outcome, StepOutcome):
        raise TypeError(f"{where} must be a StepOutcome, got {type(outcome).__name__}")
    terminated = _flag(outcome.terminated, "terminated", where)
    truncated = _flag(outcome.truncated, "truncated", where)
    return StepOutcome(
        obs=_obs(outcome.obs, where, optional=terminated or truncated),
        reward=real_reward(outcome.reward, where),
        truncated=truncated,
        terminated=terminated,
        info=_info(outcome.info, where),
    )


def checked_outcomes(outcomes: Any, acting: list[str], managed: list[str]) -> dict[str, StepOutcome]:
    """``env.step``'s answer: a dict with an outcome for every acting agent; managed agents' are checked."""
    if not isinstance(outcomes, Mapping):
        raise TypeError(f"env step must return a dict of outcomes per agent, got {type(outcomes).__name__}")
    missing = [aid for aid in acting if aid not in outcomes]
    if missing:
        raise KeyError(f"env step returned no outcome for acting agents {missing}; got {sorted(outcomes)}")
    return {aid: checked_outcome(out, aid) if aid in managed else out for aid, out in outcomes.items()}


def checked_reset(first: Any, agent_id: str) -> tuple[Obs, Info]:
    """The env's ``reset`` entry for ``agent_id``: a (str observation, info dict) pair."""
    where = f"env reset for agent {agent_id!r}"
    if not isinstance(first, Mapping) or agent_id not in first:
        raise KeyError(f"{where}: reset returned no entry for this agent")
    pair = first[agent_id]
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise TypeError(f"{where} must be an (observation, info) pair, got {type(pair).__name__} {pair!r:.80}")
    obs = _obs(pair[0], where, optional=False)
    assert obs is not None  # optional=False
    return obs, _info(pair[1], where)
