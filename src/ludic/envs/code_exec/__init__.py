"""Code execution: a sandboxed (bubblewrap) runner, a judge outside it, and a coding env."""

from ludic.envs.code_exec.bwrap import BubblewrapRunner, find_bwrap
from ludic.envs.code_exec.env import CodeExecEnv, extract_code, make_runner, shared_executor
from ludic.envs.code_exec.executor import CodeExecResult, CodeExecutor, TestCase, TestResult
from ludic.envs.code_exec.sandbox import CodeRunner, RunOutcome, SandboxLimits, SandboxUnavailableError
from ludic.envs.code_exec.unsandboxed import UnsandboxedRunner

__all__ = [
    "BubblewrapRunner",
    "CodeExecEnv",
    "CodeExecResult",
    "CodeExecutor",
    "CodeRunner",
    "RunOutcome",
    "SandboxLimits",
    "SandboxUnavailableError",
    "TestCase",
    "TestResult",
    "UnsandboxedRunner",
    "extract_code",
    "find_bwrap",
    "make_runner",
    "shared_executor",
]
