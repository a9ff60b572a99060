"""Math QA graded by ``math-verify`` (numeric and symbolic equivalence), and GSM8K loading.

``math_verify.parse`` reads the answer from ``\\boxed{...}``, LaTeX, "#### 42" or a plain number, and
``math_verify.verify`` compares gold and answer as numbers or sympy expressions (so ``0.5``,
``\\frac{1}{2}`` and ``1/2`` agree), not as strings. Grading is CPU work (sympy) that may take
long on adversarial input, so ``MathQAEnv.astep`` runs it in a worker process: the event loop
keeps serving other episodes, and math-verify's own signal-based time limits work there (they
need a main thread). Needs the ``math`` extra (``pip install 'ludic[math]'``).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from ludic.envs.dataset_qa_env import DatasetQAEnv, gsm8k_target_parser
from ludic.types import StepOutcome

MAX_ANSWER_CHARS = 4096
"""Only the reply's last this-many characters are graded (the final answer is at the end)."""


def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError as exc:  # pragma: no cover - the dev extra installs it
        raise ImportError("math-verify is not installed: pip install 'ludic[math]' (or math-verify)") from exc
    return math_verify


def grade(answer: str, target: str, *, timeout_s: int | None = 5) -> tuple[bool, str]:
    """(correct, the answer math-verify extracted). Time limits need the main thread; pass
    ``timeout_s=None`` elsewhere."""
    mv = _math_verify()
    gold = mv.parse(target, parsing_timeout=timeout_s)
    pred = mv.parse(answer[-MAX_ANSWER_CHARS:], parsing_timeout=timeout_s)
    if not gold or not pred:
        return False, str(pred[-1]) if pred else ""
    return bool(mv.verify(gold, pred, timeout_seconds=timeout_s)), str(pred[-1])


class MathGrader:
    """Grades in a pool of ``workers`` spawned processes, created on first use and shared."""

    def __init__(self, workers: int = 1, *, timeout_s: int = 5) -> None:
        self.workers = workers
        self.timeout_s = timeout_s
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                ctx = multiprocessing.get_context("spawn")  # never fork a process holding torch threads
                self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx)
            return self._pool

    async def grade(self, answer: str, target: str) -> tuple[bool, str, str | None]:
        """(correct, extracted answer, error): a grading failure is recorded, never scored silently."""
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self.pool(), _grade_in_worker, answer, target, self.timeout_s)
        try:
            correct, extracted = await asyncio.wait_for(job, timeout=self.timeout_s * 3 + 30)
        except TimeoutError:
            return False, "", "grading timed out"
        except Exception as exc:  # a crashed worker or a math-verify error: say so in the info
            return False, "", f"{type(exc).__name__}: {exc}"
        return correct, extracted, None

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(cancel_futures=True)
                self._pool = None


def _grade_in_worker(answer: str, target: str, timeout_s: int) -> tuple[bool, str]:
    return grade(answer, target, timeout_s=timeout_s)


_DEFAULT_GRADER: MathGrader | None = None


def default_grader() -> MathGrader:
    global _DEFAULT_GRADER
    if _DEFAULT_GRADER is None:
        _DEFAULT_GRADER = MathGrader()
    return _DEFAULT_GRADER


class MathQAEnv(DatasetQAEnv):
    """``DatasetQAEnv`` graded by math-verify. Step info adds ``grade_error`` (None when graded).

    target_parser defaults to ``gsm8k_target_parser`` (the text after "####"); grader defaults to
    a process-wide ``MathGrader``. Protocols call ``astep`` (graded off the event loop); the sync
    ``step`` grades in this process.
    """

    def __init__(
        self,
        sample: Mapping[str, Any],
        target_parser: Callable[[str], str] | None = gsm8k_target_parser,
        *,
        grader: MathGrader | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(sample, target_parser, **kwargs)
        self.grader = grader

    def env_step(self, action: str) -> StepOutcome:
        self._claim()
        on_main = threading.current_thread() is threading.main_thread()
        if self.target_answer is None:
            return self._outcome(False, "", "no target answer")
        correct, extracted = grade(action, self.target_answer, timeout_s=5 if on_main else None)
        return self._outcome(correct, extracted, None)

    async def env_astep(self, action: str) -> StepOutcome:
        self._claim()
        if self.target_answer is None:
            return self._outcome(False, "", "no target answer")
        grader = self.grader or default_grader()
        return self._outcome(*await grader.grade(action, self.target_answer))

    def _claim(self) -> None:
        if self._done:
            raise RuntimeError("MathQAEnv: the question was already answered; call reset()")
        self._done = True

    def _outcome(self, correct: bool, extracted: str, error: str | None) -> StepOutcome:
        info = {
            "correct": correct,
            "parsed_answer": extracted,
            "target_answer": self.target_answer,
            "question_id": self.question_id,
            "grade_error": error,
        }
        reward = self.correct_reward if correct else self.incorrect_reward
        return StepOutcome(obs=None, reward=reward, truncated=False, terminated=True, info=info)


def load_qa_rows(source: str | Path, *, split: str = "train", config: str | None = None) -> list[dict[str, Any]]:
    """Rows of a QA dataset via ``datasets``: a local ``.jsonl``/``.json`` or ``.parquet`` file, or a hub
    name (e.g. ``load_qa_rows("openai/gsm8k", config="main", split="test")`` where there is network)."""
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - the dev extra installs it
        raise ImportError("datasets is not installed: pip install 'ludic[math]' (or datasets)") from exc
    path = Path(source)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".parquet"):
        if not path.is_file():
            raise FileNotFoundError(f"load_qa_rows: no such file {path}")
        builder = "parquet" if suffix == ".parquet" else "json"
        ds = datasets.load_dataset(builder, data_files=str(path), split="train")
    else:
        ds = datasets.load_dataset(str(source), config, split=split)
    return [dict(row) for row in ds]


def gsm8k_env(rows: Sequence[Mapping[str, Any]], index: int, **kwargs: Any) -> MathQAEnv:
    """The MathQAEnv for GSM8K row ``index`` (wrapping around); rows from ``load_qa_rows``."""
    if not rows:
        raise ValueError("gsm8k_env: no rows")
    return MathQAEnv(rows[index % len(rows)], gsm8k_target_parser, **kwargs)
