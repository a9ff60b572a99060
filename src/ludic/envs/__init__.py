"""Environments: the multi-agent kernel, the single-agent base, and the bundled envs."""

from ludic.envs.dataset_qa_env import (
    DatasetQAEnv,
    answers_match,
    canonical_number,
    gsm8k_target_parser,
    normalize_answer,
)
from ludic.envs.dataset_rows import DatasetRowsEnv, dataset_qa_env
from ludic.envs.env import LudicEnv
from ludic.envs.letter_repeat import LetterRepeatEnv
from ludic.envs.math_qa import MathGrader, MathQAEnv, gsm8k_env, load_qa_rows
from ludic.envs.reasoning_gym_env import ReasoningGymEnv
from ludic.envs.single_agent_env import SingleAgentEnv
from ludic.envs.tic_tac_toe import TicTacToeEnv

__all__ = [
    "DatasetQAEnv",
    "DatasetRowsEnv",
    "LetterRepeatEnv",
    "LudicEnv",
    "MathGrader",
    "MathQAEnv",
    "ReasoningGymEnv",
    "SingleAgentEnv",
    "TicTacToeEnv",
    "answers_match",
    "canonical_number",
    "dataset_qa_env",
    "gsm8k_env",
    "gsm8k_target_parser",
    "load_qa_rows",
    "normalize_answer",
]
