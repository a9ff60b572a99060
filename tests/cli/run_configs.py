"""The tiny ``ludic train`` run the CLI tests start from, written once: each test adds only what it is about."""

from __future__ import annotations

from pathlib import Path

from ludic.testing.run_config import tiny_run_toml


def write_run_config(
    folder: Path, model: Path, *, steps: int, eval_episodes: int, lr: float = 1e-4, plot: bool = False,
    eval_extra: str = "", tables: str = "",
) -> Path:  # fmt: skip
    """``run.toml`` in ``folder``: ``tiny_run_toml`` + a greedy 4-token [eval] of ``eval_episodes`` episodes, a
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


def write_qa_run_config(
    path: Path, model: Path, *, train: Path, test: Path, steps: int, max_tokens: int, env_kwargs: str = "",
    plot: bool = True, tables: str = "",
) -> Path:  # fmt: skip
    """``path``: a ``dataset_qa`` run on the rows of ``train`` (held out: ``test``), 2 prompts x 2 per step,
    ``max_tokens`` a reply, 2 greedy held-out episodes, logging to ``path``'s folder/out without Rich (a plot
    unless not ``plot``).

    ``env_kwargs``: more ``[env] kwargs`` (``, question_key = "q"``); ``tables``: more tables, verbatim.
    """
    path.write_text(f"""steps = {steps}
[model]
path = "{model}"
[env]
name = "dataset_qa"
kwargs = {{ path = "{train}", held_out_path = "{test}"{env_kwargs} }}
[rollout]
prompts_per_step = 2
group_size = 2
sampling = {{ temperature = 1.0, max_tokens = {max_tokens} }}
[eval]
num_episodes = 2
sampling = {{ temperature = 0.0, max_tokens = {max_tokens} }}
[logging]
output_dir = "{path.parent / "out"}"
rich = false
plot = {str(plot).lower()}
{tables}""")
    return path
