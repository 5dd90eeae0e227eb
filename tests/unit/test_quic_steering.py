"""The kernel steers each QUIC datagram to the socket of the worker its destination
connection id names: ``steering_program`` attached to a real SO_REUSEPORT group of UDP
sockets on loopback (socket(7), SO_ATTACH_REUSEPORT_CBPF), real datagrams sent to it."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("aioquic")

from lameduck.listeners.quic import steer_by_worker

GROUP = 3


@pytest.fixture
def group() -> Iterator[list[socket.socket]]:
    """Three UDP sockets, one SO_REUSEPORT group on one loopback port, steered."""
    socks: list[socket.socket] = []
    try:
        for _ in range(GROUP):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", socks[0].getsockname()[1] if socks else 0))
            s.setblocking(False)
            socks.append(s)
        steer_by_worker(socks[0])
        yield socks
    finally:
        for s in socks:
            s.close()


def _where(group: list[socket.socket], datagrams: list[bytes],
           client: socket.socket | None = None) -> list[int]:
    """Which socket of the group each datagram reached, in the order sent."""
    c = client or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for d in datagrams:
            c.sendto(d, group[0].getsockname())
    finally:
        if client is None:
            c.close()
    got: dict[bytes, int] = {}
    deadline = time.monotonic() + 30
    while len(got) < len(datagrams) and time.monotonic() < deadline:
        for i, s in enumerate(group):
            with contextlib.suppress(BlockingIOError):
                got[s.recv(2048)] = i
    assert len(got) == len(datagrams)
    return [got[d] for d in datagrams]


def _short(cid: bytes, n: int) -> bytes:
    """A 1-RTT packet (RFC 9000 §17.3.1): header byte, destination id, then payload."""
    return bytes((0x40,)) + cid + n.to_bytes(4, "big") + b"\0" * 30


def _long(dcid: bytes, n: int) -> bytes:
    """A long-header packet (§17.2): header byte, version, id lengths and ids."""
    scid = os.urandom(8)
    return (bytes((0xC0,)) + (1).to_bytes(4, "big") + bytes((len(dcid),)) + dcid
            + bytes((len(scid),)) + scid + n.to_bytes(4, "big") + b"\0" * 30)


def test_a_short_header_packet_reaches_the_worker_its_id_names(group):
    sent = [(w, _short(bytes((7, w)) + os.urandom(6), n))
            for n, w in enumerate([0, 1, 2, 2, 1, 0, 1, 2, 0] * 3)]
    assert _where(group, [d for _, d in sent]) == [w for w, _ in sent]


def test_a_long_header_packet_reaches_the_worker_its_id_names(group):
    """A Handshake packet, or a client's Initial once it knows the server's id."""
    sent = [(w, _long(bytes((7, w)) + os.urandom(6), n))
            for n, w in enumerate([2, 0, 1] * 4)]
    assert _where(group, [d for _, d in sent]) == [w for w, _ in sent]


def test_an_id_naming_no_worker_is_placed_by_the_kernels_hash(group):
    """A client's first Initial names an id it drew (RFC 9000 §7.2): a second byte past the
    last worker, or an id too short, leaves the choice to the kernel's hash of the addresses:
    the same client address, the same socket, every time."""
    datagrams = [_long(bytes((7, 200)) + os.urandom(6), n) for n in range(5)]
    datagrams += [_long(b"\x01", n) for n in range(5, 10)]
    datagrams += [_short(bytes((7, 99)) + os.urandom(6), n) for n in range(10, 15)]
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        where = _where(group, datagrams, client)
    finally:
        client.close()
    assert len(set(where)) == 1, where
