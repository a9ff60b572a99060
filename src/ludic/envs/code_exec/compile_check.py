"""Does a program compile? Asked of a child process, so a compile bomb stalls nothing and is bounded.

``compile()`` is C code that holds the GIL: run in a worker thread it still stops the event loop (and
every episode on it) for as long as it takes, and some 256 KB programs take seconds (15,000 one-line list
comprehensions at module level: ~10 s on a 2-core machine). So the host compiles in a short-lived child
Python (``-I -S``: no site, no user paths, nothing imported but the compiler) that only compiles, never
executes, under a wall-clock bound (``timeout_s``: killed past it, reported as a compile failure) and an
address-space limit (a program whose compile needs more memory is a ``MemoryError``, as in-process).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

MAX_CODE_BYTES = 256 * 1024
COMPILE_MEMORY_BYTES = 2 << 30
"""The child's address-space limit (RLIMIT_AS); a compile needing more is a MemoryError."""

_CHILD = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({COMPILE_MEMORY_BYTES}, {COMPILE_MEMORY_BYTES}))
code = sys.stdin.buffer.read().decode("utf-8")
try:
    compile(code, "solution.py", "exec", dont_inherit=True)
except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
    sys.stdout.write(f"{{type(exc).__name__}}: {{exc}}")
"""


def compile_error(code: str) -> str:
    """'' if ``code`` compiles; else what is wrong. In this process: only for trusted code (tests, tools);
    the executor uses :func:`compile_error_bounded`."""
    if len(code.encode("utf-8", errors="replace")) > MAX_CODE_BYTES:
        return f"program longer than {MAX_CODE_BYTES} bytes"
    try:
        compile(code, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


async def compile_error_bounded(code: str, *, timeout_s: float) -> str:
    """:func:`compile_error`, computed by a child process: the event loop runs on meanwhile, and a compile
    running past ``timeout_s`` is killed and reported as ``compiling took longer than ...``."""
    data = code.encode("utf-8", errors="replace")
    if len(data) > MAX_CODE_BYTES:
        return f"program longer than {MAX_CODE_BYTES} bytes"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", "-c", _CHILD,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(data), timeout_s)
    except TimeoutError:
        return f"compiling took longer than {timeout_s:g} s (a compile bomb?)"
    finally:
        if proc.returncode is None:  # timed out or cancelled: the child goes too
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
    if proc.returncode != 0:  # killed by a signal (e.g. the kernel's OOM killer) or crashed
        tail = err.decode("utf-8", errors="replace").strip().splitlines()[-1:] or [""]
        return f"the compile check failed (exit status {proc.returncode}): {tail[0][:200]}"
    return out.decode("utf-8", errors="replace")
