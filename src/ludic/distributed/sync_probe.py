"""A weight sync that checks itself: score a fixed probe on the server and in the trainer after each publish.

The server scores the probe's prompt tokens (``/v1/completions`` with ``prompt_logprobs``, as
vLLM does) and reports which weight version did it; the trainer scores the same ids with its own
model. An update that silently did not apply (or applied to the wrong names, or half-way) shows
up as a log-prob gap or a stale version, and ``publish`` raises ``SyncCheckError`` instead of
training on. The gap is reported as ``sync_probe_gap`` in the publisher's ``last_stats``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ludic.distributed.interfaces import PolicyPublisher


class SyncCheckError(RuntimeError):
    """The server's weights after a publish are not the trainer's."""


class SyncProbe:
    """Compare prompt log-probs of ``token_ids`` (temperature 1) between the server and ``model``.

    tolerance: largest allowed |server - trainer| per token (bf16 training against an fp32 server
    needs more room than fp32 on both sides).
    """

    def __init__(self, model: nn.Module, client: Any, token_ids: Sequence[int], *, tolerance: float = 1e-3) -> None:
        if len(token_ids) < 2:
            raise ValueError("SyncProbe needs at least 2 token ids (the first one is not scored)")
        if tolerance <= 0:
            raise ValueError(f"tolerance must be > 0, got {tolerance}")
        self.model, self.client = model, client
        self.token_ids, self.tolerance = [int(t) for t in token_ids], tolerance

    def server_logps(self) -> tuple[list[float], str | None]:
        body = {"prompt": self.token_ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0,
                "return_weight_versions": True}  # fmt: skip
        choice = self.client.post_json_sync("/v1/completions", body)["choices"][0]
        scored = choice.get("prompt_logprobs")
        if not scored or len(scored) != len(self.token_ids):
            raise SyncCheckError(f"the server returned no prompt_logprobs for the probe: {str(choice)[:200]}")
        logps = [float(entry[str(t)]["logprob"]) for entry, t in zip(scored[1:], self.token_ids[1:], strict=True)]
        spans = choice.get("weight_versions") or []
        return logps, (str(spans[0]["version"]) if spans else None)

    def trainer_logps(self) -> list[float]:
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                ids = torch.tensor([self.token_ids], device=device)
                logits = self.model(input_ids=ids).logits[0, :-1].float()  # [T-1, V]
                logps = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        finally:
            self.model.train(was_training)
        return logps.tolist()

    def check(self, version: int | None = None) -> float:
        """The largest per-token gap; raises SyncCheckError beyond the tolerance or at a stale version."""
        served, served_version = self.server_logps()
        gap = max(abs(a - b) for a, b in zip(served, self.trainer_logps(), strict=True))
        if version is not None and served_version is not None and served_version != str(version):
            raise SyncCheckError(f"published version {version} but the server scored the probe with {served_version}")
        if gap > self.tolerance:
            raise SyncCheckError(
                f"after publishing version {version}, the server's probe log-probs differ from the trainer's by "
                f"{gap:.3g} (> tolerance {self.tolerance:g}): the update did not (fully) apply"
            )
        return gap


class ProbeCheckedPublisher:
    """Publish with ``inner``, then run ``probe.check``; ``last_stats`` adds ``sync_probe_gap``."""

    def __init__(self, inner: PolicyPublisher, probe: SyncProbe) -> None:
        self.inner, self.probe = inner, probe
        self.last_stats: dict[str, float] = {}

    def declare_restore(self, version: int) -> bool:
        from ludic.distributed.publisher import declare_restore

        return declare_restore(self.inner, version)

    def publish(self, state_dict: Mapping[str, Tensor], version: int | None = None) -> None:
        self.inner.publish(state_dict, version=version)
        gap = self.probe.check(version)
        self.last_stats = {**(getattr(self.inner, "last_stats", None) or {}), "sync_probe_gap": gap}
