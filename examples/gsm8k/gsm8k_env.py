"""A GSM8K-style QA environment over a local JSONL file; the env seed picks the problem."""

from __future__ import annotations

import re
from pathlib import Path

from ludic.envs.dataset_qa_env import canonical_number
from ludic.envs.single_agent_env import SingleAgentEnv
from ludic.registry import ENV_REGISTRY
from ludic.types import Info, Obs, StepOutcome

try:  # run as a script (examples/gsm8k on sys.path) or imported as a module
    from make_data import final_answer, read_dataset
except ImportError:  # pragma: no cover
    from examples.gsm8k.make_data import final_answer, read_dataset

SYSTEM_PROMPT = "Solve the problem. End your reply with the final number."
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number in a reply (commas removed), or None."""
    found = _NUMBER.findall(text.replace(",", ""))
    return found[-1] if found else None


class GSM8KEnv(SingleAgentEnv):
    """One-step QA: the question is the observation; reward 1.0 if the reply's last number is right."""

    def __init__(self, *, path: str) -> None:
        self.path = Path(path)
        self.rows = read_dataset(self.path)
        if not self.rows:
            raise ValueError(f"GSM8KEnv: {self.path} has no problems")
        self._row: dict[str, str] | None = None

    @property
    def suggested_sysprompt(self) -> str | None:
        return SYSTEM_PROMPT

    def env_reset(self, *, seed: int | None = None) -> tuple[Obs, Info]:
        self._row = self.rows[(seed or 0) % len(self.rows)]
        return self.env_current_obs(), {"target_answer": final_answer(self._row["answer"])}

    def env_current_obs(self) -> Obs:
        if self._row is None:
            raise RuntimeError("GSM8KEnv: call reset() first")
        return self._row["question"]

    def env_step(self, action: str) -> StepOutcome:
        if self._row is None:
            raise RuntimeError("GSM8KEnv: call reset() first")
        target = final_answer(self._row["answer"])
        parsed = last_number(action)
        # exact: float() would round big integers together and turn "1e999" into inf
        correct = parsed is not None and canonical_number(parsed) == canonical_number(target)
        info = {"correct": correct, "parsed_answer": parsed, "target_answer": target}
        return StepOutcome(
            obs=None, reward=1.0 if correct else 0.0, truncated=False, terminated=True, info=info
        )


if "gsm8k_local" not in ENV_REGISTRY:
    ENV_REGISTRY.register("gsm8k_local", GSM8KEnv)
