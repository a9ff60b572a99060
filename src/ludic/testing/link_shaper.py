"""A slow, lossy cable in user space: forwards Ethernet frames between two interfaces, delaying and dropping
the ones going one way. ``HostNetwork.netem`` runs it in the bridge's namespace.

Why not ``tc qdisc ... netem``: the kernels these tests run on are built without it
(``CONFIG_NET_SCH_NETEM`` is not set: "Specified qdisc kind is unknown"), and no other qdisc they have
(htb, tbf, pfifo) delays a packet by a fixed time. Packet sockets (``AF_PACKET``) are always there.

Frames are read and written with their virtio-net header (``PACKET_VNET_HDR``), so the large segments veth
passes around (GSO) and checksums the kernel has not filled in yet (CHECKSUM_PARTIAL) cross unchanged.

Run: ``python -m ludic.testing.link_shaper HOST_SIDE NET_SIDE --delay-ms D --loss-pct L [--rate-kbit R]
[--seed S]``: frames read on HOST_SIDE go out NET_SIDE after D ms, a fraction L/100 of them dropped, and with
R, one after another at R kbit/s (a frame of B bytes holds the line 8*B/R ms, as ``tc netem rate``), so a
write bigger than a frame crosses in pieces over a time the test sets; frames the other way pass at once. It
prints ``ready`` once both sockets are bound, and runs until killed. When HOST_SIDE goes down (``ip link set
down``: the cable pulled) the frames still held are dropped; a port that is down reads nothing and loses what
is sent to it, until it is up again.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import heapq
import random
import select
import socket
import sys
import time

_ETH_P_ALL = 0x0003
_SOL_PACKET = 263
_PACKET_VNET_HDR = 15
_PACKET_IGNORE_OUTGOING = 23  # our own sends are not read back
_MAX_FRAME = 65536 + 64  # a GSO segment (64 KiB) plus the virtio-net and Ethernet headers


def open_port(interface: str) -> socket.socket:
    """A packet socket on ``interface`` that reads every frame arriving there, with its virtio-net header."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
    sock.setsockopt(_SOL_PACKET, _PACKET_VNET_HDR, 1)
    sock.setsockopt(_SOL_PACKET, _PACKET_IGNORE_OUTGOING, 1)
    sock.bind((interface, 0))
    sock.setblocking(False)
    return sock


def forward(
    host_side: str,
    net_side: str,
    delay_ms: float,
    loss_pct: float,
    seed: int = 0,
    rate_kbit: float | None = None,
) -> None:
    """Forward frames both ways forever; the host-to-network way is delayed, lossy and (``rate_kbit``) narrow."""
    if rate_kbit is not None and rate_kbit <= 0:
        raise ValueError(f"rate_kbit={rate_kbit}: a link's rate is > 0 kbit/s (None: unlimited)")
    rng = random.Random(seed)
    line_free = 0.0  # when the rate-limited line has sent the last frame queued on it
    host, net = open_port(host_side), open_port(net_side)
    print("ready", flush=True)
    due: list[tuple[float, int, bytes]] = []  # (send time, sequence, frame) bound for ``net``
    seq = 0
    while True:
        wait = max(0.0, due[0][0] - time.monotonic()) if due else 1.0
        readable, _, _ = select.select([host, net], [], [], wait)
        if host in readable:
            frames, went_down = _drain(host)
            if went_down:  # the cable was pulled: what is still on the wire is lost with it
                due.clear()
            for frame in frames:
                if rng.random() * 100 >= loss_pct:
                    leaves = time.monotonic() + delay_ms / 1000
                    if rate_kbit is not None:  # in line behind the frames before it, then its own length
                        line_free = leaves = max(leaves, line_free) + len(frame) * 8 / (rate_kbit * 1000)
                    heapq.heappush(due, (leaves, seq, frame))
                    seq += 1
        if net in readable:
            for frame in _drain(net)[0]:
                _send(host, frame)
        now = time.monotonic()
        while due and due[0][0] <= now:
            _send(net, heapq.heappop(due)[2])


def _drain(sock: socket.socket) -> tuple[list[bytes], bool]:
    """The frames waiting on ``sock``, and whether its port reported going down."""
    frames = []
    while len(frames) < 256:
        try:
            frames.append(sock.recv(_MAX_FRAME))
        except BlockingIOError:
            break
        except OSError as exc:  # the port went down (reported once): it reads again once it is up
            if exc.errno not in (errno.ENETDOWN, errno.ENXIO):
                raise
            return frames, True
    return frames, False


def _send(sock: socket.socket, frame: bytes) -> None:
    # The link is down or its queue full: the frame is lost, as on a real wire; TCP sends it again.
    with contextlib.suppress(OSError):
        sock.send(frame)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("host_side")
    parser.add_argument("net_side")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--loss-pct", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate-kbit", type=float, default=None)
    args = parser.parse_args(argv)
    forward(args.host_side, args.net_side, args.delay_ms, args.loss_pct, args.seed, args.rate_kbit)


if __name__ == "__main__":
    sys.exit(main())
