"""Rollout requests as JSON, and request strategies (GRPO groups, identity).

Requests are pure data so they can be logged, queued (Redis) and replayed; the
``*_to_dict`` / ``*_from_dict`` pairs here round-trip them through ``json``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ludic.inference.sampling import InferenceSpec
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest


def env_spec_to_dict(spec: EnvSpec) -> dict[str, Any]:
    return {"kind": spec.kind, "kwargs": dict(spec.kwargs)}


def env_spec_from_dict(data: dict[str, Any]) -> EnvSpec:
    return EnvSpec(kind=data["kind"], kwargs=dict(data.get("kwargs") or {}))


def protocol_spec_to_dict(spec: ProtocolSpec) -> dict[str, Any]:
    return {"kind": spec.kind, "kwargs": dict(spec.kwargs)}


def protocol_spec_from_dict(data: dict[str, Any]) -> ProtocolSpec:
    return ProtocolSpec(kind=data["kind"], kwargs=dict(data.get("kwargs") or {}))


def inference_spec_to_dict(spec: InferenceSpec | None) -> dict[str, Any] | None:
    return None if spec is None else spec.to_dict()


def inference_spec_from_dict(data: dict[str, Any] | None) -> InferenceSpec | None:
    return None if data is None else InferenceSpec.from_dict(data)


def request_to_dict(request: RolloutRequest) -> dict[str, Any]:
    """A JSON-ready dict; ``request_from_dict`` gives back an equal request."""
    return {
        "env": env_spec_to_dict(request.env),
        "protocol": protocol_spec_to_dict(request.protocol),
        "env_seed": request.env_seed,
        "sampling_seed": request.sampling_seed,
        "inference": inference_spec_to_dict(request.inference),
        "num_episodes": request.num_episodes,
        "meta": dict(request.meta),
    }


def request_from_dict(data: dict[str, Any]) -> RolloutRequest:
    missing = [k for k in ("env", "protocol") if k not in data]
    if missing:
        raise KeyError(f"rollout request dict lacks {missing}; got keys {sorted(data)}")
    return RolloutRequest(
        env=env_spec_from_dict(data["env"]),
        protocol=protocol_spec_from_dict(data["protocol"]),
        env_seed=data.get("env_seed"),
        sampling_seed=data.get("sampling_seed"),
        inference=inference_spec_from_dict(data.get("inference")),
        num_episodes=int(data.get("num_episodes", 1)),
        meta=dict(data.get("meta") or {}),
    )


@runtime_checkable
class RequestStrategy(Protocol):
    """Rewrites a list of requests before they are played (e.g. into GRPO groups)."""

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]: ...


class IdentityRequestStrategy:
    """Plays the requests as given."""

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]:
        return list(requests)


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from ``parts`` (the same on every run and machine, unlike ``hash``)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (2**31 - 1)


class GRPORequestStrategy:
    """Each request becomes ``group_size`` requests: same env seed, distinct sampling seeds.

    Every copy gets ``meta["group_id"]`` (unique per original request in this strategy's
    lifetime) and ``meta["group_size"]``, which ``GroupNormalizedReturn`` groups by.
    Sampling seeds: ``sampling_seed * group_size + i`` when the request has one, otherwise
    derived from ``(seed, group_id, i)``; either way deterministic. A request with
    ``num_episodes=k`` gives a group of ``k * group_size`` episodes, so it is rejected:
    expand ``num_episodes=1`` requests.
    """

    def __init__(self, group_size: int, *, seed: int = 0) -> None:
        if not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"GRPORequestStrategy.group_size must be an int >= 1, got {group_size!r}")
        self.group_size = group_size
        self.seed = seed
        self.groups_made = 0
        """Requests expanded so far: the next group's index (saved in checkpoints)."""

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]:
        out: list[RolloutRequest] = []
        for request in requests:
            if request.num_episodes != 1:
                raise ValueError(
                    f"GRPORequestStrategy expands requests with num_episodes=1, got {request.num_episodes} "
                    f"(env kind {request.env.kind!r}); the group size sets how many episodes are played"
                )
            index = self.groups_made
            self.groups_made += 1
            group_id = request.meta.get("group_id", f"g{self.seed}-{index}")
            env_seed = request.env_seed
            if env_seed is None:  # the group must share one env instance
                env_seed = derive_seed("env", self.seed, index)
            for i in range(self.group_size):
                if request.sampling_seed is not None:
                    sampling_seed = request.sampling_seed * self.group_size + i
                else:
                    sampling_seed = derive_seed("sampling", self.seed, index, i)
                meta = {**copy.deepcopy(request.meta), "group_id": group_id, "group_size": self.group_size}
                out.append(
                    dataclasses.replace(
                        request, env_seed=env_seed, sampling_seed=sampling_seed, num_episodes=1, meta=meta
                    )
                )
        return out

    def state_dict(self) -> dict[str, int]:
        return {"groups_made": self.groups_made}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.groups_made = int(state["groups_made"])
