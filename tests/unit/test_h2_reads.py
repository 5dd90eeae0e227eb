"""How the bytes of a connection are cut into reads never changes what the server reports:
a frame begun in one read is kept (``_buf``) until it is whole, then parsed in place with
what follows it (``H2Connection._frames``)."""

from __future__ import annotations

from h2.config import H2Configuration
from h2.connection import H2Connection

from lameduck.http2.connection import H2Limits, H2Server
from tests.unit.test_h2_connection import GET, post


def _client_bytes() -> bytes:
    c = H2Connection(H2Configuration(client_side=True, header_encoding=None))
    c.initiate_connection()
    c.send_headers(1, GET, end_stream=True)
    c.send_headers(3, post(40000))
    for _ in range(4):
        c.send_data(3, b"x" * 10000)  # split by h2 into frames of at most 16384
    c.end_stream(3)
    c.ping(b"12345678")
    c.send_headers(5, [*GET[:3], (b":path", b"/last")], end_stream=True)
    return c.data_to_send()


def _events(reads: list[bytes], limits: H2Limits | None = None) -> list:
    srv = H2Server(limits)
    srv.initiate()
    out: list = []
    for r in reads:
        out += srv.receive(r, 0.0)
        assert len(srv._buf) < 9 + srv._accept_frame
    assert not srv.closed and not srv._buf
    return out


def test_any_read_size_gives_the_same_events() -> None:
    data = _client_bytes()
    whole = _events([data])
    assert [type(e).__name__ for e in whole].count("DataReceived") >= 3
    for size in (1, 2, 8, 9, 10, 100, 4096, 16393, 16394):
        reads = [data[i:i + size] for i in range(0, len(data), size)]
        assert _events(reads) == whole, size


def test_a_large_frame_over_many_reads() -> None:
    """A 1 MiB DATA frame (SETTINGS_MAX_FRAME_SIZE raised) in 1000-octet reads: gathered, and
    reported once, whole."""
    lim = H2Limits(max_frame_size=1 << 20, initial_window_size=1 << 21,
                   connection_window=1 << 22)
    c = H2Connection(H2Configuration(client_side=True, header_encoding=None))
    c.initiate_connection()
    c.send_headers(1, post(1 << 20))
    head = c.data_to_send()
    body = bytes(range(256)) * 4096
    frame = (len(body).to_bytes(3, "big") + b"\x00\x01" + (1).to_bytes(4, "big") + body)
    data = head + frame
    events = _events([data[i:i + 1000] for i in range(0, len(data), 1000)], lim)
    got = [e for e in events if type(e).__name__ == "DataReceived"]
    assert len(got) == 1 and got[0].data == body and got[0].end_stream
