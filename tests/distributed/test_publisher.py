"""Publishers: ClientPublisher forwards to sync_weights; Rank0OnlyPublisher builds/publishes on rank 0 only."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ludic.distributed import (
    ClientPublisher,
    PolicyPublisher,
    Rank0OnlyPublisher,
    create_vllm_publisher,
    current_rank,
)
from ludic.distributed.adapters import create_vllm_publisher as adapters_factory


class _RecordingClient:
    """Stands in for a ChatClient's weight-sync half (the part ClientPublisher talks to)."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, torch.Tensor], float, int | None]] = []

    def sync_weights(
        self, params: Mapping[str, torch.Tensor], *, timeout_s: float = 600.0, version: int | None = None
    ) -> str:
        self.calls.append((dict(params), timeout_s, version))
        return f"ok v{version}"


def test_client_publisher_forwards_weights_and_version() -> None:
    client = _RecordingClient()
    pub = ClientPublisher(client, timeout_s=5.0)
    weight = torch.ones(2)
    pub.publish({"w": weight}, version=7)
    assert len(client.calls) == 1
    params, timeout, version = client.calls[0]
    assert list(params) == ["w"] and params["w"] is weight and timeout == 5.0 and version == 7
    assert pub.last_status == "ok v7"
    assert isinstance(pub, PolicyPublisher)


def test_client_publisher_rejects_client_without_sync_weights() -> None:
    with pytest.raises(TypeError, match="object has none"):
        ClientPublisher(object())


def test_rank0_only_publisher_is_a_no_op_on_other_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    built: list[int] = []
    pub = Rank0OnlyPublisher(lambda: built.append(1) or ClientPublisher(_RecordingClient()))
    pub.publish({"w": torch.zeros(1)}, version=1)
    assert built == [] and pub.inner is None and pub.rank == 1


def test_rank0_only_publisher_uses_torch_distributed_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "3")  # ignored once a process group exists
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert current_rank() == 0
        client = _RecordingClient()
        pub = Rank0OnlyPublisher(lambda: ClientPublisher(client))
        pub.publish({"w": torch.zeros(1)}, version=4)
    finally:
        dist.destroy_process_group()
    assert [v for _, _, v in client.calls] == [4]


def test_rank0_only_publisher_decides_its_rank_at_publish_not_when_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "2")  # what a launcher says before the process group exists
    client = _RecordingClient()
    built: list[int] = []
    pub = Rank0OnlyPublisher(lambda: built.append(1) or ClientPublisher(client))
    assert built == [] and pub.rank is None
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        pub.publish({"w": torch.zeros(1)}, version=5)
    finally:
        dist.destroy_process_group()
    assert pub.rank == 0 and built == [1] and [v for _, _, v in client.calls] == [5]


def test_create_vllm_publisher_wraps_for_rank0_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from ludic.distributed import BroadcastPolicyPublisher
    from ludic.inference import VLLMChatClient

    monkeypatch.delenv("RANK", raising=False)
    client = _RecordingClient()
    client.enable_weight_updates = True  # type: ignore[attr-defined]
    pub = create_vllm_publisher(client, transport="blob")
    assert isinstance(pub, Rank0OnlyPublisher) and pub.inner is None  # built at the first publish
    pub.publish({"w": torch.zeros(1)}, version=2)
    assert isinstance(pub.inner, ClientPublisher) and [v for _, _, v in client.calls] == [2]
    plain = adapters_factory(client, rank0_only=False, transport="blob")
    assert isinstance(plain, ClientPublisher)
    vllm = VLLMChatClient(port=1, enable_weight_updates=True)
    assert isinstance(create_vllm_publisher(vllm, rank0_only=False), BroadcastPolicyPublisher)
    with pytest.raises(ValueError, match="enable_weight_updates=True"):
        create_vllm_publisher(VLLMChatClient(port=1))
    with pytest.raises(ValueError, match="transport"):
        create_vllm_publisher(vllm, transport="carrier-pigeon")
