"""The tiny ``ludic train`` run the CLI tests start from, written once: each test adds only what it is about."""

from __future__ import annotations

from pathlib import Path

from ludic.testing.run_config import tiny_run_toml


def write_run_config(
    folder: Path, model: Path, *, steps: int, eval_episodes: int, lr: float = 1e-4, plot: bool = False,
    eval_extra: str = "", tables: str = "",
) -> Path:  # fmt: skip
    """``folder/run.toml``: ``tiny_run_toml`` + a greedy 4-token [eval] of ``eval_episodes`` episodes, a
    [trainer] of 128-token sequences at ``lr``, [logging] to ``folder/out`` (no Rich; a plot only if ``plot``).

    ``eval_extra``: more [eval] lines; ``tables``: more tables ([checkpoint], [pipeline], ...), verbatim.
    """
    text = tiny_run_toml(model, steps=steps, tables=f"""
[eval]
num_episodes = {eval_episodes}
sampling = {{ temperature = 0.0, max_tokens = 4 }}
{eval_extra}
[trainer]
lr = {lr}
max_seq_len = 128
micro_token_budget = 1024
[logging]
output_dir = "{folder / "out"}"
rich = false
plot = {str(plot).lower()}
{tables}""")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.toml"
    path.write_text(text)
    return path
