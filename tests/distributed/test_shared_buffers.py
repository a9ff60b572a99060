"""PeerBuffers (the trainer's mappings of a server's shared weight buffers), against real memfds of this process."""

from __future__ import annotations

import os

import pytest

from ludic.distributed.shared_buffers import PeerBuffers
from ludic.inference.weight_sync.shared_memory import SharedBuffer
from ludic.inference.weight_sync.shared_memory import allocate_shared as allocate


@pytest.fixture
def allocate_shared():
    """allocate_shared, with every buffer's file descriptor closed after the test."""
    made: list[SharedBuffer] = []

    def make(nbytes: int, buffer_id: int) -> SharedBuffer:
        made.append(allocate(nbytes, buffer_id))
        return made[-1]

    yield make
    for buffer in made:
        buffer.close()


def reservation(buffer) -> dict[str, int]:
    return {"buffer": buffer.buffer_id, "pid": os.getpid(), "fd": buffer.fd, "file_bytes": buffer.nbytes}


def test_a_view_writes_into_the_servers_buffer_and_one_mapping_serves_every_publish(allocate_shared):
    served = allocate_shared(4096, buffer_id=1)
    peers = PeerBuffers()
    view = peers.view(reservation(served), 100)
    view.fill_(7)
    assert (
        view.numel() == 100 and int(served.tensor[:100].sum()) == 700 and int(served.tensor[100:].sum()) == 0
    )
    peers.end_publish()
    again = peers.view(reservation(served), 4096)
    assert again.data_ptr() == view.data_ptr() and len(peers) == 1  # the mapping was reused, not remade


def test_buffers_unused_for_two_publishes_are_unmapped(allocate_shared):
    buffers = [allocate_shared(4096, buffer_id=i) for i in range(1, 5)]
    peers = PeerBuffers()
    for buffer in buffers[:3]:  # one buffer per publish
        peers.view(reservation(buffer), 10)
        peers.end_publish()
    assert len(peers) == 2  # buffers 2 and 3
    peers.view(reservation(buffers[1]), 10)
    peers.end_publish()
    assert len(peers) == 2  # 3 (the publish before) and 2 (this one)


def test_a_reservation_too_small_or_malformed_is_refused(allocate_shared):
    buffer = allocate_shared(64, buffer_id=9)
    peers = PeerBuffers()
    with pytest.raises(RuntimeError, match="reserved 64 bytes for a call of 65"):
        peers.view(reservation(buffer), 65)
    with pytest.raises(RuntimeError, match="malformed"):
        peers.view({"buffer": 9, "pid": os.getpid()}, 8)
    with pytest.raises(RuntimeError, match="announced 128"):
        peers.view(reservation(buffer) | {"file_bytes": 128}, 8)
