"""docs/configs.md's key reference is generated from the schema (``ludic.config.reference``) and current."""

from __future__ import annotations

from pathlib import Path

from ludic.config import RunConfig
from ludic.config.errors import _fields, _table_in
from ludic.config.reference import config_reference, generated_part

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configs.md"


def test_the_page_holds_the_reference_the_schema_generates() -> None:
    part = generated_part(PAGE.read_text())
    assert part is not None, f"{PAGE} has no generated part"
    assert part == config_reference(), (
        "docs/configs.md is out of date with the schema: run python -m ludic.config.reference --write docs/configs.md"
    )


def test_every_table_and_key_is_listed_with_its_default() -> None:
    text = config_reference()
    for name, info in RunConfig.model_fields.items():
        table = _table_in(info.annotation)
        if table is None:
            assert f"| `{name}` |" in text
            continue
        section = text.split(f"### `[{name}]`", 1)[1].split("\n### `[", 1)[0]
        for key in _fields(table):
            assert f"| `{key}` |" in section or f"### `[{name}.{key}]`" in text, (name, key)
    assert "| `temperature` | float | `0.0` |" in text  # [eval.sampling]: the table's own default (greedy)
    assert "| `temperature` | float | `1.0` |" in text  # [rollout.sampling]
    assert "| `max_seq_len` | int | `2048` |" in text  # a dataclass table: [trainer]
    assert "| `output_dir` | str \\| Path | `<logging.output_dir>/checkpoints` |" in text  # a derived default
    assert "| `path` | str | required |" in text
