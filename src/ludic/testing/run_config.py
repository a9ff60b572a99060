"""The smallest ``ludic train`` config for tests: the letter-repeat task on a tiny model, 2 prompts x 2."""

from __future__ import annotations

from pathlib import Path


def tiny_run_toml(model_dir: str | Path, *, steps: int, tables: str = "") -> str:
    """TOML text: ``steps``, [model], [env] (letter_repeat, "ab" x 2) and [rollout], then ``tables`` verbatim.

    Tests add the tables they exercise ([eval], [trainer], [inference], [pipeline], [checkpoint], ...).
    """
    return f"""steps = {steps}
[model]
path = "{model_dir}"
[env]
name = "letter_repeat"
kwargs = {{ count = 2, letters = "ab" }}
[rollout]
prompts_per_step = 2
group_size = 2
sampling = {{ temperature = 1.0, max_tokens = 4 }}
{tables.lstrip()}"""
