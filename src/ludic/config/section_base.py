"""The base of every run-config table, and the bound check the tables share (``ludic.config.schema``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every table: unknown keys are errors; field docstrings are their documentation."""

    model_config = ConfigDict(extra="forbid", strict=True, use_attribute_docstrings=True)


def _at_least(section: BaseModel, minimum: int, *names: str) -> None:
    for name in names:
        if getattr(section, name) < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {getattr(section, name)}")
