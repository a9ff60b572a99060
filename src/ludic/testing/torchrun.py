"""The command line of a ``torchrun`` a test starts, its logs kept in the test's own folder.

Without ``--log-dir`` torchrun makes a ``torchelastic_*`` folder in the system's temporary directory for every
run and leaves it there (a full test run left 144 of them).
"""

from __future__ import annotations

import sys
from pathlib import Path


def torchrun_argv(log_dir: str | Path, *options: str) -> list[str]:
    """``python -m torch.distributed.run --log-dir LOG_DIR OPTIONS...`` with this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", f"--log-dir={log_dir}", *options]
