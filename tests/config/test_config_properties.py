"""Run configs, property-tested (issue 37): ``parse_config`` on a valid config with keys changed to any
value, and ``read_config_file`` on any text.

Invariant: refused with ``ConfigError`` whose every line names the file (and the key, where one is at
fault), or accepted with every key given holding exactly the value given (ints read as floats where a
float is expected, lists as tuples); never another exception.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ludic.config import ConfigError, RunConfig, parse_config, read_config_file

BASE = {
    "steps": 3,
    "model": {"path": "models/tiny"},
    "env": {"name": "letter_repeat", "kwargs": {"count": 3}},
}
_SECTIONS = {
    name: list(getattr(field.annotation, "model_fields", {}))
    for name, field in RunConfig.model_fields.items()
    if getattr(field.annotation, "model_fields", None)
}
_SECTIONS["trainer"] = [
    "lr",
    "max_seq_len",
    "micro_token_budget",
    "max_grad_norm",
    "seed",
    "betas",
    "lr_schedule",
]
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_DEFAULTS = parse_config(BASE).model_dump(mode="json")


def _plausible(section: str, key: str) -> st.SearchStrategy:
    """Values near the key's default (its type, small numbers): the config accepts many of them."""
    default = (_DEFAULTS.get(section) or {}).get(key)
    near = st.just(default)
    if type(default) is int:
        near |= st.integers(-2, 2 * default + 4)
    elif type(default) is float:
        near |= st.floats(-1.0, 2 * default + 1.0) | st.integers(0, 3)
    elif type(default) is bool:
        near |= st.booleans()
    return near


_changes = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(sorted(_SECTIONS)), st.none(), _json),  # a whole table replaced
        st.sampled_from(sorted(_SECTIONS)).flatmap(
            lambda s: st.sampled_from([*_SECTIONS[s], "no_such_key"]).flatmap(
                lambda k: st.tuples(st.just(s), st.just(k), _plausible(s, k) | _json)
            )
        ),
        st.tuples(st.just(""), st.sampled_from(["steps", "seed", "imports", "no_such_key"]), _json),
    ),
    min_size=1,
    max_size=3,
)


def _same(got, want) -> bool:
    """``got`` (as the config holds it) is ``want`` (as written): tuples for lists, floats for ints."""
    if isinstance(got, BaseModel) or dataclasses.is_dataclass(got):
        return True  # a table: its keys are compared one by one where they were given
    if isinstance(want, list):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(map(_same, got, want))
    if isinstance(want, dict):
        return (
            isinstance(got, dict) and got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
        )
    if isinstance(want, float) and math.isnan(want):
        return False  # NaN is never a value a config keeps
    return got == want and (type(want) is not bool or type(got) is bool)


@given(_changes)
def test_any_changed_keys_are_refused_naming_the_file_or_held_exactly(changes):
    data = json.loads(json.dumps(BASE))
    for section, key, value in changes:
        if not section:
            data[key] = value
        elif key is None:
            data[section] = value
        else:
            table = data.get(section)
            data[section] = {**(table if isinstance(table, dict) else {}), key: value}
    try:
        cfg = parse_config(data, file="run.toml")
    except ConfigError as exc:
        assert exc.errors and all(line.startswith("run.toml") for line in exc.errors)
        return
    event("accepted")
    for section, key, _ in changes:
        if not section:
            assert _same(getattr(cfg, key), data[key]), (key, getattr(cfg, key), data[key])
        elif key is None or not isinstance(data[section], dict):
            continue
        elif key in data[section]:
            holder = getattr(cfg, section)
            got = getattr(holder, key)
            assert _same(got, data[section][key]), (section, key, got, data[section][key])


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=80), suffix=st.sampled_from([".toml", ".yaml"]))
def test_any_config_text_is_refused_naming_the_file_or_read_as_a_table(tmp_path, text, suffix):
    path = tmp_path / f"c{suffix}"
    path.write_text(text, encoding="utf-8")
    try:
        data = read_config_file(path)
    except ConfigError as exc:
        assert exc.errors and all(line.startswith(path.name) for line in exc.errors)
        return
    assert isinstance(data, dict)
    try:
        parse_config(data, file=path.name)
    except ConfigError as exc:
        assert all(line.startswith(path.name) for line in exc.errors)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_numbers_are_refused_where_a_number_is_expected(value):
    with pytest.raises(ConfigError) as info:
        parse_config({**BASE, "trainer": {"lr": value}}, file="run.toml")
    assert any("[trainer]" in line and ".lr" in line for line in info.value.errors)
