"""The pieces of HTTP/3's hot restart that need no process: the generation mark, the
forwarded datagram's framing, and what a forwarding socket does once its reader is gone."""

from __future__ import annotations

import pytest

pytest.importorskip("aioquic")

from lameduck.listeners.quic import (
    forward_pair,
    generation_mark,
    pack_forwarded,
    unpack_forwarded,
)


@pytest.mark.parametrize("addr", [("127.0.0.1", 50123), ("::1", 443, 0, 0),
                                  ("fe80::1", 8443, 5, 2)])
def test_a_forwarded_datagram_keeps_its_address_as_asyncio_gave_it(addr):
    """aioquic compares a path's address with the one a datagram came from: the tuple must
    come out as it went in, IPv6's flow info and scope id too."""
    data = bytes(range(256)) * 5
    assert unpack_forwarded(pack_forwarded(addr, data)) == (addr, data)


def test_the_mark_is_the_epoch_in_one_byte():
    assert [generation_mark(e) for e in (0, 1, 255, 256, 257)] == [0, 1, 255, 0, 1]


def test_a_forwarding_socket_fails_once_its_reader_has_exited():
    """The newest process learns that an older one has gone from its send failing (only the
    older process holds the reading end), and forgets it."""
    inbox, outlet = forward_pair()
    outlet.send(pack_forwarded(("127.0.0.1", 1), b"x"))
    assert unpack_forwarded(inbox.recv(65536)) == (("127.0.0.1", 1), b"x")
    inbox.close()
    with pytest.raises(ConnectionRefusedError):
        outlet.send(b"y")
    outlet.close()
