"""``[timeouts]`` and ``ludic.timeouts``: one set of bounds, checked when read, one error naming what waited."""

from __future__ import annotations

import pickle
from dataclasses import fields

import pytest
from pydantic import ValidationError

from ludic.config.schema import RunConfig
from ludic.config.timeouts_section import TimeoutsSection
from ludic.timeouts import Timeouts, WaitTimeout


def run_config(**timeouts: object) -> RunConfig:
    return RunConfig.model_validate({"model": {"path": "m"}, "env": {"name": "e"}, "timeouts": timeouts})


def test_the_table_and_the_dataclass_have_the_same_keys_and_defaults() -> None:
    assert TimeoutsSection().to_timeouts() == Timeouts()
    assert list(TimeoutsSection.model_fields) == [f.name for f in fields(Timeouts)]
    assert (
        RunConfig.model_validate({"model": {"path": "m"}, "env": {"name": "e"}}).timeouts.to_timeouts()
        == Timeouts()
    )


def test_a_set_bound_reaches_the_dataclass() -> None:
    t = run_config(http_s=2.5, queue_wait_s=7, on_stall="exit").timeouts.to_timeouts()
    assert (t.http_s, t.queue_wait_s, t.on_stall, t.redis_s) == (2.5, 7, "exit", 30.0)


@pytest.mark.parametrize(
    ("override", "named"),
    [({"http_s": 0}, "http_s"), ({"collective_s": -1.0}, "collective_s"), ({"redis_s": "5"}, "redis_s"),
     ({"on_stall": "abort"}, "on_stall"), ({"watchdog_s": 5}, "watchdog_s")],
)  # fmt: skip
def test_a_wrong_bound_is_refused_naming_the_key(override: dict, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        run_config(**override)


def test_the_dataclass_refuses_zero_and_bools() -> None:
    with pytest.raises(ValueError, match="step_watchdog_s must be a number of seconds > 0, got 0"):
        Timeouts(step_watchdog_s=0)
    with pytest.raises(ValueError, match="publish_s"):
        Timeouts(publish_s=True)


def test_wait_timeout_names_peer_operation_and_time_and_survives_pickling() -> None:
    err = WaitTimeout(peer="redis://h:1", operation="XREAD", waited_s=3.04, bound_s=3, detail="pending=2")
    assert isinstance(err, TimeoutError)
    assert str(err) == "XREAD: no answer from redis://h:1 after 3.0 s (bound 3 s); pending=2"
    back = pickle.loads(pickle.dumps(err))
    assert (back.peer, back.operation, back.waited_s, back.bound_s, back.detail) == (
        "redis://h:1",
        "XREAD",
        3.04,
        3,
        "pending=2",
    )
    assert str(back) == str(err)
