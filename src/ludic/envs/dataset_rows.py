"""QA over the rows of a data-set file, training rows kept apart from held-out rows.

The ``dataset_qa`` env kind of ``ludic train`` / ``ludic eval``: rows come from a ``.jsonl`` file (read
line by line here: a line that is not a UTF-8 JSON object, or lacks a field, is an error naming the file
and line) or a ``.json`` / ``.parquet`` file (read by :func:`ludic.envs.math_qa.load_qa_rows`, which fills
a field a row lacks with null); a row without a question, or whose question is not a non-blank string,
or whose answer is not a string, a number or null, is an error either way. Every such error is a
:class:`DatasetRowsError` naming the file, the row (and line) and the field; a file that cannot be read at
all (a corrupt parquet) is one naming the file. A UTF-8 byte-order mark at the start of a ``.jsonl`` file
is skipped, as Python's ``utf-8-sig`` codec does. The episode with env
seed ``s`` asks row ``s % len(rows)`` of its split. Held-out rows come from a second file (``held_out_path``) or
are a seeded fraction of the file (``held_out_fraction``); either way no held-out row is a training
row. ``split="eval"`` (which ``ludic train`` / ``ludic eval`` pass to evaluations by themselves) plays
the held-out rows.
"""

from __future__ import annotations

import codecs
import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from ludic.envs.dataset_qa_env import DatasetQAEnv, gsm8k_target_parser
from ludic.envs.demonstrations import Demonstration
from ludic.types import Info, Obs

Split = Literal["train", "eval"]


class DatasetRowsError(ValueError, KeyError):
    """A data-set file or row ``dataset_qa`` refuses; the message names the file, the row and the field.

    A ``ValueError`` (and, for a missing field, as before, a ``KeyError``)."""

    __str__ = ValueError.__str__  # the message as written, not KeyError's repr of it


TARGET_FORMATS: dict[str, Callable[[str], str] | None] = {"plain": None, "gsm8k": gsm8k_target_parser}
"""``target_format`` names: how the answer field becomes the target (gsm8k: the text after "####")."""


class DatasetRowsEnv(DatasetQAEnv):
    """``DatasetQAEnv`` over many rows: ``reset(seed=s)`` asks row ``s % len(rows)`` (row 0 without a seed)."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], **kwargs: Any) -> None:
        if not rows:
            raise ValueError(f"{type(self).__name__}: no rows to ask")
        self.rows = rows
        super().__init__(rows[0], **kwargs)

    def env_reset(self, *, seed: int | None = None) -> tuple[Obs, Info]:
        self._load_sample(self.rows[(seed or 0) % len(self.rows)])
        return super().env_reset(seed=seed)

    def demonstrations(self, n: int, seed: int) -> list[Demonstration]:
        """``n`` correct answers to this env's rows (an SFT warm start; build the env with its training
        split): a seeded shuffle of the rows with an answer, cycled; the answer is the row's target."""
        if n < 1:
            raise ValueError(f"{type(self).__name__}.demonstrations: n must be >= 1, got {n}")
        answered = [(row, t) for row in self.rows if (t := self.target_of(row))]
        if not answered:
            raise ValueError(f"{type(self).__name__}: no row has an answer to demonstrate")
        order = list(range(len(answered)))
        random.Random(seed).shuffle(order)
        picks = (answered[order[i % len(order)]] for i in range(n))
        return [
            Demonstration(self.question_format.render(str(row[self.question_key])), self.write_answer(target))
            for row, target in picks
        ]


def split_rows(
    rows: Sequence[Mapping[str, Any]], fraction: float, seed: int
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(training rows, held-out rows): a seeded shuffle, the first ``round(fraction * n)`` held out.

    Both parts keep the file's order; each has at least one row or this raises."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"held_out_fraction must be between 0 and 1 (exclusive), got {fraction}")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_held = round(fraction * len(rows))
    if n_held == 0 or n_held == len(rows):
        raise ValueError(
            f"held_out_fraction {fraction} of {len(rows)} rows leaves "
            f"{'no held-out' if n_held == 0 else 'no training'} rows; change the fraction or add rows"
        )
    held = set(order[:n_held])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


@lru_cache(maxsize=16)
def _cached_rows(path: str, mtime_ns: int, size: int, keys: tuple[str, ...]) -> tuple[Mapping[str, Any], ...]:
    from ludic.envs.math_qa import load_qa_rows

    if path.lower().endswith(".jsonl"):
        lines = _jsonl_rows(path)
    else:
        try:
            lines = [(i, row) for i, row in enumerate(load_qa_rows(path), 1)]
        except Exception as exc:  # pyarrow's and datasets' errors name neither the file nor what it is
            kind = Path(path).suffix.lower()[1:]
            raise DatasetRowsError(f"dataset_qa: {path!r} cannot be read as {kind}: {type(exc).__name__}: {str(exc)[:300]}") from exc  # fmt: skip
    if not lines:
        raise DatasetRowsError(f"dataset_qa: {path!r} holds no rows")
    for i, (line, row) in enumerate(lines):
        where = f"row {i} of {path!r}" + (f" (line {line})" if path.lower().endswith(".jsonl") else "")
        _check_row(row, keys, where)
    return tuple(row for _, row in lines)


def _check_row(row: Mapping[str, Any], keys: tuple[str, ...], where: str) -> None:
    """``row`` has ``keys``; the first (the question) a non-blank string, the second (the answer) a string, a
    finite number, a bool or null: ``str(42)`` is a fine target, ``str({...})`` or an int question asked as "42" are not."""
    missing = [k for k in keys if k not in row]
    if missing:
        raise DatasetRowsError(f"dataset_qa: {where} has no {missing} field; fields: {sorted(row)}")
    if not keys:
        return
    question = row[keys[0]]
    if question is None:  # never ask the model "None"
        raise DatasetRowsError(f"dataset_qa: {where} has a null {keys[0]!r}")
    if not isinstance(question, str) or not question.strip():
        what = (
            "a blank string"
            if isinstance(question, str)
            else f"a {type(question).__name__} ({question!r:.40})"
        )
        raise DatasetRowsError(f"dataset_qa: {where}: {keys[0]!r} must be a non-blank string, got {what}")
    if len(keys) > 1:
        answer = row[keys[1]]
        if not (
            answer is None
            or type(answer) in (str, bool, int)
            or (type(answer) is float and math.isfinite(answer))
        ):
            raise DatasetRowsError(
                f"dataset_qa: {where}: {keys[1]!r} must be a string, a finite number, a bool or null, "
                f"got a {type(answer).__name__} ({answer!r:.40})"
            )


def _jsonl_rows(path: str) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) per non-blank line; a line that is not a UTF-8 JSON object is named."""
    rows = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if n == 1 and raw.startswith(codecs.BOM_UTF8):  # written by some editors and Windows tools
                raw = raw[len(codecs.BOM_UTF8) :]
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (
                ValueError,
                RecursionError,
            ) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
                raise DatasetRowsError(f"dataset_qa: line {n} of {path!r} is not UTF-8 JSON: {str(exc)[:200]}") from None  # fmt: skip
            if not isinstance(row, dict):
                raise DatasetRowsError(f"dataset_qa: line {n} of {path!r} is a JSON {type(row).__name__}, not an object")  # fmt: skip
            rows.append((n, row))
    return rows


def read_rows(path: str | Path, keys: tuple[str, ...] = ()) -> tuple[Mapping[str, Any], ...]:
    """The rows of a local data-set file, each checked to have ``keys`` (the first, the question, not null);
    read once per file version (the env is built per episode)."""
    p = Path(path)
    if p.suffix.lower() not in (".jsonl", ".json", ".parquet"):
        raise ValueError(f"dataset_qa: {str(path)!r} is not a .jsonl, .json or .parquet file")
    if not p.is_file():
        raise FileNotFoundError(f"dataset_qa: no such file {str(path)!r}")
    stat = p.stat()
    return _cached_rows(str(p.resolve()), stat.st_mtime_ns, stat.st_size, keys)


def split_of(
    path: str,
    split: Split,
    held_out_path: str | None,
    held_out_fraction: float | None,
    split_seed: int,
    keys: tuple[str, ...] = (),
) -> Sequence[Mapping[str, Any]]:
    """The rows of ``split``; "eval" needs a held-out source, and two sources at once are refused."""
    if split not in ("train", "eval"):
        raise ValueError(f"dataset_qa: split must be 'train' or 'eval', got {split!r}")
    if held_out_path is not None and held_out_fraction is not None:
        raise ValueError("dataset_qa: give held_out_path or held_out_fraction, not both")
    rows = read_rows(path, keys)
    if held_out_fraction is not None:
        train, held = split_rows(rows, held_out_fraction, split_seed)
        return train if split == "train" else held
    if split == "train":
        return rows
    if held_out_path is None:
        raise ValueError(
            f"dataset_qa: split 'eval' needs held-out rows apart from {path!r}: set held_out_path (a second "
            "file) or held_out_fraction (e.g. 0.1) in [env].kwargs"
        )
    return read_rows(held_out_path, keys)


def dataset_qa_env(
    *,
    sample: Mapping[str, Any] | None = None,
    path: str | None = None,
    split: Split = "train",
    held_out_path: str | None = None,
    held_out_fraction: float | None = None,
    split_seed: int = 0,
    target_format: str = "plain",
    question_key: str = "question",
    answer_key: str = "answer",
    system_prompt: str | None = None,
    correct_reward: float = 1.0,
    incorrect_reward: float = 0.0,
    reward_fn: Callable[[str, str | None, Mapping[str, Any]], float] | None = None,
    instruction: str | None = None,
    question_template: str | None = None,
    answer: str | None = None,
) -> DatasetQAEnv:
    """The ``dataset_qa`` kind: one fixed ``sample`` row, or the rows of ``split`` of the file ``path``.

    path: a .jsonl / .json / .parquet file of rows with ``question_key`` and ``answer_key`` fields.
    split: "train" or "eval" (held-out rows: ``held_out_path``'s, or ``held_out_fraction`` of ``path``
        chosen with ``split_seed``). target_format: "plain" or "gsm8k" (the answer after "####").
    reward_fn: ``reward_fn(reply, target, row) -> float`` instead of exact match (``[env].reward``).
    instruction / question_template / answer: the answer format asked for and its extractor
        (``ludic.envs.answer_format``: e.g. ``instruction="Put the answer in \\boxed{}."``, ``answer="boxed"``).
    """
    if target_format not in TARGET_FORMATS:
        raise ValueError(
            f"dataset_qa: target_format must be one of {sorted(TARGET_FORMATS)}, got {target_format!r}"
        )
    qa_kwargs: dict[str, Any] = dict(
        target_parser=TARGET_FORMATS[target_format], question_key=question_key, answer_key=answer_key,
        system_prompt=system_prompt, correct_reward=correct_reward, incorrect_reward=incorrect_reward,
        reward_fn=reward_fn, instruction=instruction, question_template=question_template, answer=answer,
    )  # fmt: skip
    if (sample is None) == (path is None):
        raise ValueError("dataset_qa: give exactly one of sample (one row) or path (a data-set file)")
    if sample is not None:
        if isinstance(sample, Mapping):  # (anything else: DatasetQAEnv names it)
            _check_row(sample, (question_key, answer_key), "sample")
        return DatasetQAEnv(sample, **qa_kwargs)
    rows = split_of(
        str(path), split, held_out_path, held_out_fraction, split_seed, (question_key, answer_key)
    )
    return DatasetRowsEnv(rows, **qa_kwargs)
