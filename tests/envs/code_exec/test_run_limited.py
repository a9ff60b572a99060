"""``run_limited`` on its own: a writer that outlives the kill of its process group (as a sandbox's
processes do while their namespace is torn down) still lets the run end, with its output capped."""

import sys
import textwrap

from ludic.envs.code_exec.sandbox import SandboxLimits, run_limited

# a child in a session of its own (out of reach of the group kill) writes 12.8 MB, then exits
ESCAPING_WRITER = textwrap.dedent(
    """
    import os, sys
    os.setsid()
    for _ in range(200):
        sys.stdout.buffer.write(b"x" * 65536)
    sys.stdout.flush()
    """
)


async def test_output_past_the_cap_is_read_and_dropped_so_the_exit_can_be_awaited():
    argv = ["/bin/sh", "-c", f'"{sys.executable}" -c "$0"; sleep 30', ESCAPING_WRITER]
    limits = SandboxLimits(wall_s=20, max_output_bytes=64 * 1024, memory_mb=4096)
    outcome = await run_limited(argv, b"", limits, user=None, env={})
    # before the fix the reader stopped at the cap, the pipe filled, the writer blocked forever,
    # and the run failed with "did not end 30 s after SIGKILL"
    assert outcome.status == "output_limit"
    assert outcome.stdout == b"x" * (64 * 1024)
    assert outcome.wall_s < 15
