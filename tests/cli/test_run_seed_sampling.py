"""The run's ``seed`` changes what training samples (a pretrained model has no random init to change);
held-out evaluations keep the same sampling seeds in every run."""

from __future__ import annotations

from pathlib import Path

from ludic.cli.runtime import GroupedRequests, make_evaluator, sampling_seed
from ludic.config import parse_config


def _cfg(seed: int) -> object:
    return parse_config({
        "seed": seed, "model": {"path": "m"}, "env": {"name": "letter_repeat"},
        "rollout": {"prompts_per_step": 3, "seed": 5},
    })  # fmt: skip


def test_training_sampling_seeds_follow_the_run_seed_and_seed_0_keeps_the_env_seed() -> None:
    runs = {s: GroupedRequests(_cfg(s), _cfg(s).rollout.sampling.to_sampling())() for s in (0, 1, 2)}
    assert [r.env_seed for r in runs[0]] == [r.env_seed for r in runs[1]] == [5, 6, 7]  # same prompts
    assert [r.sampling_seed for r in runs[0]] == [5, 6, 7]
    seeds = {s: tuple(r.sampling_seed for r in reqs) for s, reqs in runs.items()}
    assert len(set(seeds.values())) == 3  # three runs, three different draws
    assert all(0 <= x < 2**31 for xs in seeds.values() for x in xs)
    assert sampling_seed(3, 2**31 - 1) < 2**31


def test_held_out_sampling_seeds_are_the_same_in_every_run(tmp_path: Path) -> None:
    a = make_evaluator(_cfg(0), engine=None, out_dir=tmp_path / "a")
    b = make_evaluator(_cfg(1), engine=None, out_dir=tmp_path / "b")
    assert [r.sampling_seed for r in a.requests] == [r.sampling_seed for r in b.requests]
