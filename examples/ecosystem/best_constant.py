"""The best constant answer's held-out reward for a reasoning-gym run config: the bar RL must clear.

    python examples/ecosystem/best_constant.py examples/ecosystem/reasoning_gym.toml

Scores candidate constant replies with the data set's own ``score_answer`` on exactly the held-out
items the run's evaluation plays (env seeds ``[eval].seed_offset ..``, item ``seed % n``). Candidates:
every training answer, plus the per-position most common character of the training answers (for
position-scored data sets such as ``spell_backward`` that string is the exact optimum).
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from ludic.config import load_config
from ludic.envs.reasoning_gym_env import reasoning_gym_rows


def best_constant(config_path: str) -> tuple[str, float]:
    """(the best constant reply, its mean held-out reward) for a ``reasoning_gym`` run config."""
    cfg = load_config(config_path)
    kwargs: dict[str, Any] = dict(cfg.env.kwargs)
    dataset, train, held = reasoning_gym_rows(
        kwargs.pop("dataset"),
        **{k: kwargs[k] for k in ("config", "size", "eval_size", "seed") if k in kwargs},
    )
    played = [held[(cfg.eval.seed_offset + i) % len(held)]["entry"] for i in range(cfg.eval.num_episodes)]
    answers = [str(r["answer"]) for r in train]
    candidates = set(answers) | {_per_position_mode(answers)}

    def reward(reply: str) -> float:
        return sum(float(dataset.score_answer(answer=reply, entry=e)) for e in played) / len(played)

    best = max(sorted(candidates), key=reward)
    return best, reward(best)


def _per_position_mode(answers: list[str]) -> str:
    longest = max(map(len, answers))
    columns = ([a[i].lower() for a in answers if len(a) > i] for i in range(longest))
    return "".join(Counter(c).most_common(1)[0][0] for c in columns)


if __name__ == "__main__":
    reply, value = best_constant(
        sys.argv[1] if len(sys.argv) > 1 else "examples/ecosystem/reasoning_gym.toml"
    )
    print(f"best constant answer {reply!r}: held-out reward {value:.3f}")
