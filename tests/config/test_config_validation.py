"""Run-config validation: every error names the file, the key and the expected type."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ludic.config import ConfigError, load_config, parse_config
from ludic.config.schema import ModelSection

MINIMAL = """
steps = 3
[model]
path = "models/tiny"
[env]
name = "letter_repeat"
kwargs = { count = 3 }
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _errors(tmp_path: Path, name: str, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, name, text))
    return info.value.errors


def test_minimal_toml_fills_defaults(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, "run.toml", MINIMAL))
    assert cfg.steps == 3
    assert cfg.model == ModelSection(path="models/tiny")
    assert cfg.env.name == "letter_repeat"
    assert cfg.env.kwargs == {"count": 3}
    assert cfg.harness.name == "plain"
    assert cfg.protocol.name == "single_agent"
    assert cfg.algorithm.name == "grpo"
    assert cfg.inference.backend == "embedded"
    assert cfg.eval.sampling.temperature == 0.0
    assert cfg.source == "run.toml"


def test_yaml_and_toml_give_the_same_config(tmp_path: Path) -> None:
    yaml_text = (
        "steps: 3\nmodel:\n  path: models/tiny\nenv:\n  name: letter_repeat\n  kwargs:\n    count: 3\n"
    )
    from_yaml = load_config(_write(tmp_path, "run.yaml", yaml_text))
    from_toml = load_config(_write(tmp_path, "run.toml", MINIMAL))
    assert from_yaml.env == from_toml.env
    assert from_yaml.model == from_toml.model
    assert from_yaml.steps == from_toml.steps == 3


def test_wrong_type_names_file_key_and_expected_type(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL + '[rollout]\ngroup_size = "eight"\n')
    assert errors == ["config.toml: [rollout].group_size: expected int, got str 'eight'"]


def test_nested_table_errors_use_dotted_section(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL + "[eval.sampling]\ntemperature = true\n")
    assert errors == ["config.toml: [eval.sampling].temperature: expected float, got bool True"]


def test_int_is_accepted_where_float_expected(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, "run.toml", MINIMAL + "[rollout.sampling]\ntemperature = 1\n"))
    assert cfg.rollout.sampling.temperature == 1.0
    assert isinstance(cfg.rollout.sampling.temperature, float)


def test_unknown_key_lists_known_keys(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL + "[logging]\nplott = false\n")
    assert errors == ["config.toml: [logging].plott: unknown key; known keys: completions_count, "
                      "completions_every, output_dir, plot, progress_bars, rich, tensorboard, wandb"]  # fmt: skip


def test_unknown_top_level_table_is_reported(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "c.yaml", "model: {path: m}\nenv: {name: e}\nmodle: {path: m}\n")
    assert len(errors) == 1
    assert errors[0].startswith("c.yaml: modle: unknown key; known keys: algorithm, checkpoint,")


def test_missing_required_key_is_reported(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", '[env]\nname = "letter_repeat"\n')
    assert errors == ["config.toml: model: missing required key (expected table (ModelSection))"]


def test_literal_choices_are_listed(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL + '[inference]\nbackend = "ollama"\n')
    assert errors == ["config.toml: [inference].backend: expected 'embedded' | 'server' | 'vllm', got str 'ollama'"]


def test_vllm_backend_needs_a_url_and_a_merged_lora_publish(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL + '[inference]\nbackend = "vllm"\n')
    assert errors == ["config.toml: [inference]: backend 'vllm' needs server_url (e.g. 'http://127.0.0.1:8000')"]
    vllm = '[inference]\nbackend = "vllm"\nserver_url = "http://127.0.0.1:8000"\n'
    (error,) = _errors(tmp_path, "config.toml", MINIMAL + vllm + "[lora]\nrank = 2\n")
    assert 'vLLM serves a runtime adapter only under its own model name' in error and 'publish = "merged"' in error
    cfg = load_config(_write(tmp_path, "config.toml", MINIMAL + vllm + '[lora]\nrank = 2\npublish = "merged"\n'))
    assert cfg.inference.backend == "vllm" and cfg.lora is not None and cfg.lora.publish == "merged"


def test_server_backend_without_url_fails_validation(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL + '[inference]\nbackend = "server"\n')
    assert errors == [
        "config.toml: [inference]: backend 'server' needs server_url (e.g. 'http://127.0.0.1:8000')"
    ]


def test_max_batch_size_with_a_server_backend_is_refused_not_ignored(tmp_path: Path) -> None:
    text = (
        MINIMAL + '[inference]\nbackend = "server"\nserver_url = "http://127.0.0.1:1"\nmax_batch_size = 8\n'
    )
    errors = _errors(tmp_path, "config.toml", text)
    assert len(errors) == 1 and "max_batch_size sizes the embedded engine" in errors[0]
    assert "--max-batch-size" in errors[0]


def test_all_errors_are_reported_together(tmp_path: Path) -> None:
    text = MINIMAL.replace("steps = 3", 'steps = "many"') + "[rollout]\ngroup_size = 2.5\nbogus = 1\n"
    errors = _errors(tmp_path, "config.toml", text)
    assert sorted(errors) == [
        "config.toml: [rollout].bogus: unknown key; known keys: concurrency, group_size, max_steps, "
        "prompts_per_step, sampling, seed",
        "config.toml: [rollout].group_size: expected int, got float 2.5",
        "config.toml: steps: expected int, got str 'many'",
    ]


def test_value_checks_of_section_dataclasses_are_reported(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL + "[rollout]\ngroup_size = 0\n")
    assert errors == ["config.toml: [rollout]: group_size must be >= 1, got 0"]


def test_unparseable_file_and_unknown_suffix_are_reported(tmp_path: Path) -> None:
    assert _errors(tmp_path, "bad.toml", "steps = = 3")[0].startswith("bad.toml: cannot parse:")
    assert _errors(tmp_path, "run.ini", MINIMAL) == [
        "run.ini: unsupported config format '.ini'; use .toml, .yaml or .yml"
    ]


def test_parse_config_accepts_plain_dicts() -> None:
    cfg = parse_config({"model": {"path": "m"}, "env": {"name": "letter_repeat"}}, file="inline")
    assert cfg.source == "inline"
    assert cfg.rollout.group_size == 8


def test_trainer_table_is_checked_against_trainer_config(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL + "[trainer]\nlr = 'abc'\n")
    assert errors == ["config.toml: [trainer].lr: expected float, got str 'abc'"]


def test_trainer_and_checkpoint_tables_build_their_configs(tmp_path: Path) -> None:
    from ludic.training.config import CheckpointConfig, TrainerConfig

    text = MINIMAL + "[trainer]\nlr = 0.001\nmax_seq_len = 64\nmicro_token_budget = 512\n"
    text += '[logging]\noutput_dir = "out"\n[checkpoint]\nevery_n_steps = 5\n'
    cfg = load_config(_write(tmp_path, "run.toml", text))
    assert isinstance(cfg.trainer, TrainerConfig)
    assert (cfg.trainer.lr, cfg.trainer.max_seq_len, cfg.trainer.micro_token_budget) == (0.001, 64, 512)
    assert isinstance(cfg.checkpoint, CheckpointConfig)
    assert cfg.checkpoint.output_dir == Path("out/checkpoints")
    assert cfg.checkpoint.every_n_steps == 5


def test_trainer_config_value_errors_name_the_table(tmp_path: Path) -> None:
    errors = _errors(
        tmp_path, "config.toml", MINIMAL + "[trainer]\nmax_seq_len = 64\nmicro_token_budget = 32\n"
    )
    assert len(errors) == 1
    assert errors[0].startswith(
        "config.toml: [trainer]: TrainerConfig.micro_token_budget (32) must be >= max_seq_len"
    )


def test_optional_field_errors_collapse_into_one_line(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL + "[trainer]\nmax_grad_norm = 'x'\n")
    assert errors == ["config.toml: [trainer].max_grad_norm: expected float | None, got str 'x'"]


def test_strings_are_never_coerced_to_numbers(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL.replace("steps = 3", 'steps = "3"'))
    assert errors == ["config.toml: steps: expected int, got str '3'"]


def test_scalar_where_a_table_is_expected(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "c.yaml", "model: {path: m}\nenv: {name: e}\nrollout: 3\n")
    assert errors == ["c.yaml: rollout: expected table (RolloutSection), got int 3"]


def test_unknown_trainer_key_lists_trainer_config_fields(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL + "[trainer]\nlrr = 0.1\n")
    assert len(errors) == 1
    assert errors[0].startswith(
        "config.toml: [trainer].lrr: unknown key; known keys: betas, block_attention, cpu_kernels, eval_concurrency,"
    )


def test_lists_become_tuples_for_tuple_fields(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, "run.toml", MINIMAL + "[trainer]\nbetas = [0.8, 0.9]\n"))
    assert cfg.trainer.betas == (0.8, 0.9)


def test_toml_dates_are_refused_with_their_key(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "config.toml", MINIMAL + "[logging]\noutput_dir = 2024-01-02\n")
    assert errors == [
        "config.toml: [logging].output_dir: date values are not supported; quote it ('2024-01-02')"
    ]


def test_every_schema_field_is_documented() -> None:
    from ludic.config import RunConfig, Section

    sections = [RunConfig] + [
        f.annotation for f in RunConfig.model_fields.values() if isinstance(f.annotation, type)
    ]
    for section in sections:
        if isinstance(section, type) and issubclass(section, Section):
            for name, f in section.model_fields.items():
                assert f.description, f"{section.__name__}.{name} has no docstring"


def test_non_utf8_file_names_the_byte_and_line(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_bytes(MINIMAL.encode() + b"# caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    offset = len(MINIMAL) + len("# caf")
    assert MINIMAL.count("\n") + 1 == 8
    assert info.value.errors == [
        f"run.toml: not UTF-8 text: byte 0xe9 at line 8 (offset {offset}); save the file as UTF-8"
    ]


@pytest.mark.timeout(30)
def test_yaml_alias_bomb_is_refused_without_expanding_it(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]  # 10^12 values
    errors = _errors(tmp_path, "bomb.yaml", "\n".join(lines) + "\n")
    assert errors == [
        "bomb.yaml: expands to more than 100000 values through YAML aliases (an alias bomb?); write the values out"
    ]


def test_small_yaml_aliases_still_work(tmp_path: Path) -> None:
    text = "sampling: &s {temperature: 0.5, max_tokens: 8}\nmodel: {path: m}\nenv: {name: e}\n"
    text += "rollout: {sampling: *s}\neval: {sampling: *s}\n"
    errors = _errors(tmp_path, "run.yaml", text)
    assert errors == ["run.yaml: sampling: unknown key; known keys: algorithm, checkpoint, cluster, env, eval, "
                      "harness, imports, inference, logging, lora, model, pipeline, protocol, rollout, seed, sft, steps, "
                      "timeouts, trainer"]  # fmt: skip


def test_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "big.toml", MINIMAL + "#" * (1 << 20))
    assert len(errors) == 1 and "is too large for a run config (limit 1048576)" in errors[0]


DEEP_LIMIT = "nested more than 32 tables/lists deep (limit 32); flatten the value"
BASE = '[model]\npath = "m"\n[env]\nname = "e"\n'


@pytest.mark.parametrize("depth", [33, 250, 490, 5000])
def test_deeply_nested_yaml_is_refused_naming_key_line_and_limit(tmp_path: Path, depth: int) -> None:
    deep = "[" * depth + "]" * depth
    text = f"model: {{path: m}}\nenv:\n  name: e\n  kwargs: {{data: {{x: {deep}}}}}\n"
    assert _errors(tmp_path, "run.yaml", text) == [f"run.yaml: [env.kwargs.data].x (line 4): {DEEP_LIMIT}"]


@pytest.mark.parametrize("depth", [33, 250])
def test_deeply_nested_toml_is_refused_naming_line_and_limit(tmp_path: Path, depth: int) -> None:
    deep = "[" * depth + "]" * depth
    errors = _errors(tmp_path, "run.toml", f"{BASE}[env.kwargs.data]\nx = {deep}\n")
    assert errors == [f"run.toml: line 6: {DEEP_LIMIT}"]


def test_nesting_up_to_the_limit_is_accepted(tmp_path: Path) -> None:
    deep = "[" * 29 + "1" + "]" * 29  # env, kwargs, data and 29 lists: 32 levels below the top
    for name, text in [
        ("run.toml", f"{BASE}[env.kwargs.data]\nx = {deep}\n"),
        ("run.yaml", f"model: {{path: m}}\nenv: {{name: e, kwargs: {{data: {{x: {deep}}}}}}}\n"),
    ]:
        value = load_config(_write(tmp_path, name, text)).env.kwargs["data"]["x"]
        for _ in range(29):
            (value,) = value
        assert value == 1
    too_deep = "[" * 30 + "1" + "]" * 30
    errors = _errors(tmp_path, "run.toml", f"{BASE}[env.kwargs.data]\nx = {too_deep}\n")
    assert errors == [f"run.toml: [env.kwargs.data].x: {DEEP_LIMIT}"]


def test_deep_dotted_keys_are_refused_with_a_shortened_key_path(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "run.toml", f"{BASE}[env.kwargs]\n{'a.' * 490}b = 1\n")
    assert errors == [f"run.toml: [env.kwargs.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a...: {DEEP_LIMIT}"]


def test_deep_plain_dicts_are_refused_not_a_recursion_error() -> None:
    value: dict = {}
    for _ in range(490):
        value = {"a": value}
    with pytest.raises(ConfigError, match=r"<config>: \[env.kwargs.a.a.a.*nested more than 32"):
        parse_config({"model": {"path": "m"}, "env": {"name": "e", "kwargs": value}})


@pytest.mark.parametrize("depth", [490, 5000])
def test_toml_too_deep_for_the_parser_is_refused_before_parsing_naming_the_line(
    tmp_path: Path, depth: int
) -> None:
    deep = "[" * depth + "]" * depth
    text = f'{BASE}# a comment [[[[ and a string do not count\n[env.kwargs]\ns = "[[[[{{{{"\nx = {deep}\n'
    assert _errors(tmp_path, "run.toml", text) == [f"run.toml: line 8: {DEEP_LIMIT}"]


def test_brackets_in_toml_strings_and_comments_do_not_count_as_nesting(tmp_path: Path) -> None:
    text = f'{BASE}[env.kwargs]\n# {"[" * 40}\ns = \'{"[" * 40}\'\nt = """\n{"{" * 40}\n"""\n'
    assert load_config(_write(tmp_path, "run.toml", text)).env.kwargs["s"] == "[" * 40


def test_a_recursive_yaml_alias_is_refused_by_depth(tmp_path: Path) -> None:
    errors = _errors(tmp_path, "run.yaml", "model: {path: m}\nenv: {name: e, kwargs: {x: &x [*x]}}\n")
    assert errors == [f"run.yaml: [env.kwargs].x: {DEEP_LIMIT}"]


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("model:\n  path: a\nenv:\n  name: e\nmodel:\n  path: b\n", "model", (1, 5)),
        ("model:\n  path: a\n  path: b\nenv:\n  name: e\n", "path", (2, 3)),
        ("model: {path: a}\nenv: {name: e, kwargs: {n: 1, n: 2}}\n", "n", (2, 2)),
    ],
)
def test_a_yaml_key_written_twice_is_refused_naming_key_and_lines(tmp_path: Path, text, key, lines) -> None:
    assert _errors(tmp_path, "run.yaml", text) == [
        f"run.yaml: key {key!r} appears twice in one table (line {lines[0]} and line {lines[1]}); "
        "YAML would silently keep the second: remove one"
    ]


def test_yaml_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    text = "model:\n  <<: {path: a, dtype: bfloat16}\n  path: b\nenv: {name: e}\n"
    cfg = load_config(_write(tmp_path, "run.yaml", text))
    assert (cfg.model.path, cfg.model.dtype) == ("b", "bfloat16")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (BASE + "[model]\npath = 'b'\n", r"Cannot declare \('model',\) twice \(at line 5"),
        (BASE.replace('path = "m"', 'path = "a"\npath = "b"'), r"Cannot overwrite a value \(at line 3"),
    ],
)
def test_toml_already_refuses_a_key_written_twice(tmp_path: Path, text: str, why: str) -> None:
    (error,) = _errors(tmp_path, "run.toml", text)
    assert re.match(rf"run.toml: cannot parse: {why}", error)
