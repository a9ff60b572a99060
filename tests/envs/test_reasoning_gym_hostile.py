"""reasoning-gym data sets with bad entries or scorers, registered in the real package: each is an error naming
the data set and the item, never a silent reward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym")

from reasoning_gym.dataset import ProceduralDataset  # noqa: E402

from ludic.envs import ReasoningGymEnv  # noqa: E402


@dataclass
class Config:
    seed: int | None = None
    size: int = 10


def _dataset(name: str, item: Any, score: float = 1.0) -> str:
    """Register (once) a data set whose every item is ``item(i)`` and whose scorer returns ``score``."""

    class Made(ProceduralDataset):
        def __init__(self, config: Config) -> None:
            super().__init__(config=config, seed=config.seed, size=config.size)

        def __getitem__(self, idx: int) -> Any:
            return item(idx)

        def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float:
            return score

    if name not in reasoning_gym.factory.DATASETS:
        reasoning_gym.register_dataset(name, Made, Config)
    return name


def test_an_item_without_an_answer_field_is_named() -> None:
    name = _dataset("ludic_no_answer", lambda i: {"question": f"q{i}", "metadata": {"source_index": i}})
    with pytest.raises(ValueError, match=r"'ludic_no_answer': item 0 has no 'answer' field"):  # was: KeyError
        ReasoningGymEnv(name, size=2, eval_size=1)


def test_an_item_without_a_text_question_is_named() -> None:
    name = _dataset("ludic_no_question", lambda i: {"question": None, "answer": "a", "metadata": None})
    with pytest.raises(ValueError, match=r"'ludic_no_question': item 0 has no text question"):
        ReasoningGymEnv(name, size=2, eval_size=1)


def test_an_answer_of_none_is_many_answers_and_still_scored() -> None:
    name = _dataset("ludic_many_answers", lambda i: {"question": f"q{i}", "answer": None, "metadata": {}})
    env = ReasoningGymEnv(name, size=2, eval_size=1)
    env.reset(seed=1)
    outcome = env.step({"agent_0": "anything"})["agent_0"]
    assert (outcome.reward, outcome.info["target_answer"], outcome.info["question_id"]) == (1.0, None, "1")


@pytest.mark.parametrize("score", [float("nan"), float("inf")])
def test_a_non_finite_score_is_an_error_naming_the_item(score: float) -> None:
    name = _dataset(f"ludic_score_{score}", lambda i: {"question": f"q{i}", "answer": "a"}, score=score)
    env = ReasoningGymEnv(name, size=2, eval_size=1)
    env.reset(seed=1)
    with pytest.raises(RuntimeError, match=rf"score_answer gave {score} on item 1"):  # was: reward {score}
        env.step({"agent_0": "a"})
