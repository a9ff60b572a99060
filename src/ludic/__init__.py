"""Ludic: a hackable library for training LLM agents with reinforcement learning."""

__version__ = "0.1.0"
