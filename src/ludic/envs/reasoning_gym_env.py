"""reasoning-gym tasks as Ludic envs: any data set by name, scored by the data set's own ``score_answer``.

Needs the ``reasoning-gym`` extra (``pip install 'ludic[reasoning-gym]'``); it is imported only when an
env is built. reasoning-gym generates item ``i`` of a data set from ``Random(seed + i)``, so two seeds
share items (``seed=0`` item 5 is ``seed=5`` item 0). Held-out prompts are therefore taken from the
same generator at indices after the training ones (``size .. size + eval_size - 1``), and any held-out
item whose question also appears among the training items is dropped: no held-out prompt is a training
prompt. The episode with env seed ``s`` asks item ``s % n`` of its split.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal

from ludic.envs.dataset_rows import DatasetRowsEnv
from ludic.types import StepOutcome

EXTRA = "reasoning-gym"


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(
            f"the reasoning_gym env needs the {EXTRA!r} extra: pip install 'ludic[{EXTRA}]' "
            f"(or pip install {EXTRA})"
        ) from exc
    return reasoning_gym


@lru_cache(maxsize=16)
def _splits(name: str, config_json: str, size: int, eval_size: int, seed: int) -> tuple[Any, tuple, tuple]:
    """(data set, training rows, held-out rows), generated once per configuration (see ``_as_row``)."""
    dataset = _reasoning_gym().create_dataset(
        name, size=size + eval_size, seed=seed, **json.loads(config_json)
    )
    train = tuple(_as_row(name, i, dataset[i]) for i in range(size))
    seen = {row["question"] for row in train}
    held = tuple(
        row
        for row in (_as_row(name, i, dataset[i]) for i in range(size, size + eval_size))
        if row["question"] not in seen
    )
    if not held:
        raise ValueError(
            f"reasoning_gym {name!r}: all {eval_size} held-out items repeat a training question; "
            "raise eval_size or change the data set's config"
        )
    return dataset, train, held


def reasoning_gym_rows(
    dataset: str,
    *,
    config: Mapping[str, Any] | None = None,
    size: int = 1000,
    eval_size: int = 200,
    seed: int = 0,
) -> tuple[Any, Sequence[dict[str, Any]], Sequence[dict[str, Any]]]:
    """(the reasoning-gym data set, training rows, held-out rows); see the module docstring.

    Each row has ``question``, ``answer``, ``id`` (the item's index) and ``entry`` (the item itself)."""
    if size < 1 or eval_size < 1:
        raise ValueError(
            f"reasoning_gym: size and eval_size must be >= 1, got size={size}, eval_size={eval_size}"
        )
    for key in ("size", "seed"):
        if key in (config or {}):
            raise ValueError(f"reasoning_gym: give {key} as the env's own {key!r} argument, not in config")
    try:
        config_json = json.dumps(dict(config or {}), sort_keys=True)
    except TypeError as exc:
        raise ValueError(f"reasoning_gym: config must hold plain values: {exc}") from exc
    return _splits(dataset, config_json, size, eval_size, seed)


class ReasoningGymEnv(DatasetRowsEnv):
    """One reasoning-gym question per episode; reward ``score_answer(reply, entry)`` (0..1).

    dataset: a reasoning-gym name (``reasoning_gym.factory.DATASETS``), e.g. "letter_counting".
    config: the data set's own config fields (e.g. ``{"min_words": 3, "max_words": 5}``).
    size / eval_size: training / held-out items; seed: the generator's seed.
    split: "train" or "eval" (``ludic train`` / ``ludic eval`` pass "eval" to evaluations).
    instruction / question_template / answer: the answer format the prompt asks for, kept apart from the
        system prompt (a chat model's default one stays), and the extractor that reads it in front of
        ``score_answer`` (``ludic.envs.answer_format``).
    Step info: ``score`` (what score_answer returned), ``correct`` (score == 1), ``target_answer``,
    ``question_id`` (the item's ``source_index``), ``dataset``.
    """

    def __init__(
        self,
        dataset: str,
        *,
        config: Mapping[str, Any] | None = None,
        size: int = 1000,
        eval_size: int = 200,
        seed: int = 0,
        split: Literal["train", "eval"] = "train",
        system_prompt: str | None = None,
        instruction: str | None = None,
        question_template: str | None = None,
        answer: str | None = None,
    ) -> None:
        if split not in ("train", "eval"):
            raise ValueError(f"reasoning_gym: split must be 'train' or 'eval', got {split!r}")
        self.dataset_name = dataset
        self.dataset, train, held = reasoning_gym_rows(
            dataset, config=config, size=size, eval_size=eval_size, seed=seed
        )
        super().__init__(
            train if split == "train" else held, system_prompt=system_prompt, instruction=instruction,
            question_template=question_template, answer=answer,
        )  # fmt: skip

    def env_step(self, action: str) -> StepOutcome:
        if self._done:
            raise RuntimeError("ReasoningGymEnv: the question was already answered; call reset()")
        self._done = True
        entry = self.sample["entry"]
        answer = self.read_answer(action)  # the extractor's match, or the whole reply without one
        try:
            score = float(self.dataset.score_answer(answer=answer if answer is not None else "", entry=entry))
        except Exception as exc:  # name the item: a crashed scorer is never a silent 0
            raise RuntimeError(
                f"reasoning_gym {self.dataset_name!r}: score_answer raised on item {self.question_id}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not math.isfinite(score):  # nothing trains on a NaN / inf reward
            raise RuntimeError(
                f"reasoning_gym {self.dataset_name!r}: score_answer gave {score} on item {self.question_id}"
            )
        info = {
            "score": score,
            "correct": score == 1.0,
            "answer_found": answer is not None,
            "parsed_answer": answer,
            "target_answer": self.target_answer,
            "question_id": self.question_id,
            "dataset": self.dataset_name,
        }
        return StepOutcome(obs=None, reward=score, truncated=False, terminated=True, info=info)


def _as_row(name: str, index: int, item: Any) -> dict[str, Any]:
    """A DatasetQAEnv row: question, answer, the item's index as its id, and the item itself for scoring.

    An item without a text question, or without an ``answer`` field, is an error naming the data set and
    the item (``answer: None`` is reasoning-gym's "many answers": the scorer judges the reply alone)."""
    where = f"reasoning_gym {name!r}: item {index}"
    if not isinstance(item, dict):
        raise ValueError(f"{where} is a {type(item).__name__}, not a dict with question and answer")
    if not isinstance(item.get("question"), str):
        raise ValueError(f"{where} has no text question: {str(item.get('question'))[:80]!r}")
    if "answer" not in item:
        raise ValueError(f"{where} has no 'answer' field; fields: {sorted(item)}")
    metadata = item.get("metadata")
    source = metadata.get("source_index") if isinstance(metadata, dict) else None
    return {"question": item["question"], "answer": item["answer"], "id": index if source is None else source,
            "entry": item}  # fmt: skip
