"""Evaluation: run fixed held-out requests, reduce to ``eval/`` stats, write JSONL + summary."""

from ludic.eval.evaluator import GREEDY, Evaluator
from ludic.eval.intervals import wilson
from ludic.eval.protocol import EvalStats, PolicyEvaluator
from ludic.eval.records import episode_record, step_records

__all__ = ["GREEDY", "EvalStats", "Evaluator", "PolicyEvaluator", "episode_record", "step_records", "wilson"]
