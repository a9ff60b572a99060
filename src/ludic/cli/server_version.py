"""``--dry-run``'s look at the run's server: a ``ludic train`` on a server (``[inference] backend = "server"`` or
``"vllm"``) must find it at the policy version the run starts from.

A server counts weight versions and refuses one that goes back. A fresh run publishes versions 1, 2, ...
(a resumed one its checkpoint's step first) and samples its first steps from the weights served, which must
be ``[model].path``'s. A server an earlier run published to serves that run's weights at a higher version:
the run would train on another policy's samples and die at its first publish. Said before any model loads.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ludic.config import RunConfig

_STEP_DIR = re.compile(r"step_(\d+)")


def start_version(cfg: RunConfig) -> int:
    """The version this run publishes first: its latest checkpoint's step (a resume), else 0."""
    folder = Path(cfg.checkpoint.output_dir if cfg.checkpoint else Path(cfg.logging.output_dir) / "checkpoints")
    steps = [int(m.group(1)) for p in folder.glob("step_*") if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir()]
    return max(steps, default=0)


def server_version_errors(cfg: RunConfig) -> list[str]:
    """The server's ``/policy_version`` above :func:`start_version` is an error naming the fix. A server that
    does not answer yet is left to the run's first request (it may be started after the dry run)."""
    import httpx

    if cfg.inference.backend == "embedded" or not cfg.inference.server_url or cfg.steps == 0:
        return []
    url = cfg.inference.server_url.rstrip("/")
    key = os.environ.get("LUDIC_API_KEY")
    try:
        reply = httpx.get(url + "/policy_version", timeout=5.0,
                          headers={"Authorization": f"Bearer {key}"} if key else {})  # fmt: skip
        served = int(reply.json()["policy_version"]) if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return []
    start = start_version(cfg)
    if served is None or served <= start:
        return []
    begins, first = (f"resumes at step {start}", start) if start else ("starts fresh", 1)
    return [
        f"[inference].server_url: {url} serves policy_version {served}, published by an earlier run, and this "
        f"run {begins}: it would sample from that run's weights, not [model].path's, and its first publish "
        f"(version {first}) would be refused (versions never go back); restart the server on [model].path"
    ]
