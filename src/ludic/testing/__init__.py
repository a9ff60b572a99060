"""Offline helpers for tests, demos and benchmarks: tiny real models built locally."""

from ludic.testing.threads import alone_process_env, alone_threads
from ludic.testing.tiny_model import CHATML_TEMPLATE, build_tiny_model, tiny_model_path
from ludic.testing.torchrun import torchrun_argv

__all__ = ["CHATML_TEMPLATE", "alone_process_env", "alone_threads", "build_tiny_model", "tiny_model_path", "torchrun_argv"]
