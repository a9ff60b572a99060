"""The main job's config (examples/configs/smollm2_arithmetic.toml) asks for the format it reads, holds out
questions it never trains on, and evaluates on enough episodes; docs/real-models.md's figures rest on these."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ludic.config import load_config
from ludic.envs.answer_format import answer_extractor
from ludic.envs.reasoning_gym_env import reasoning_gym_rows

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "smollm2_arithmetic.toml"


def test_the_format_the_prompt_quotes_is_the_one_the_answer_is_read_from() -> None:
    kwargs = load_config(str(CONFIG)).env.kwargs
    quoted = re.findall(r"'([^']*N[^']*)'", kwargs["instruction"])
    assert len(quoted) == 1, kwargs["instruction"]
    extract = answer_extractor(kwargs["answer"]).extract
    assert extract(quoted[0].replace("N", "12")) == "12"
    assert extract("Let me add. " + quoted[0].replace("N", "7")) == "7"
    # the model's habit without the colon is not the asked format: greedy before-RL replies in it score 0
    assert extract("The answer is 12.") is None


def test_held_out_questions_are_not_training_questions_and_the_eval_is_64_episodes_or_more() -> None:
    cfg = load_config(str(CONFIG))
    kwargs = dict(cfg.env.kwargs)
    _, train, held = reasoning_gym_rows(
        kwargs.pop("dataset"),
        **{k: kwargs[k] for k in ("config", "size", "eval_size", "seed") if k in kwargs},
    )
    assert len(train) == kwargs["size"]
    assert held and not {r["question"] for r in held} & {r["question"] for r in train}
    assert cfg.eval.num_episodes >= 64
    assert cfg.eval.sampling.temperature == 0.0  # greedy


def _held_out_replies(tmp_path: Path, *overrides: str) -> list[dict]:
    from ludic.cli import main
    from ludic.models import catalogue_entry
    from ludic.models.cache import is_prepared
    from ludic.models.pull import prepared_path

    name = load_config(str(CONFIG)).model.path
    if not is_prepared(prepared_path(catalogue_entry(name).name)):
        pytest.fail(f"{name} is not prepared: bash scripts/setup.sh pulls it (ludic models pull {name})")
    out = tmp_path / "eval"
    argv = ["eval", str(CONFIG), "--output-dir", str(out)]
    for override in overrides:
        argv += ["--set", override]
    assert main(argv) == 0
    (episodes,) = (out / "eval").glob("eval_call_*.jsonl")
    return [json.loads(line)["steps"][0]["info"] for line in episodes.read_text().splitlines()]


@pytest.mark.slow
def test_the_untrained_model_seldom_answers_in_the_format_greedily_but_samples_it(tmp_path: Path) -> None:
    """docs/real-models.md "Why this format": greedily 26 of 64 held-out replies are in the format (0.172
    right), sampled at temperature 0.8 about a quarter: the habit is RL's to teach and GRPO's groups reach it."""
    greedy = _held_out_replies(tmp_path / "greedy")
    assert len(greedy) == 64
    assert sum(r["answer_found"] for r in greedy) <= 40
    assert sum(r["correct"] for r in greedy) / len(greedy) <= 0.25  # doubling then needs 0.5, within reach
    sampled = _held_out_replies(tmp_path / "sampled", "eval.sampling.temperature=0.8")
    assert sum(r["answer_found"] for r in sampled) >= 8
