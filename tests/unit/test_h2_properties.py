"""Properties: the HPACK codec agrees with the ``hpack`` package both ways, and how the byte
stream is cut into reads does not change what the server reports."""

from __future__ import annotations

import itertools

import h2.events as ce
import hpack
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.settings import SettingCodes
from hypothesis import given, settings
from hypothesis import strategies as st

from lameduck.http2.codec import Decoder, Encoder
from lameduck.http2.connection import H2Server
from tests.unit.test_h2_connection import GET, Pair, post

names = st.sampled_from([b"accept", b"x-a", b"x-b", b"content-type", b"date", b"cookie",
                         b"authorization", b"content-length", b"set-cookie", b"server"])
values = st.binary(min_size=0, max_size=300).map(lambda v: v.replace(b"\0", b""))
header_lists = st.lists(st.tuples(names, values), max_size=12)


@settings(max_examples=8, deadline=None)
@given(st.lists(header_lists, min_size=1, max_size=8), st.sampled_from([4096, 256, 0, 100]))
def test_our_encoder_with_hpack_decoder(blocks: list, table: int) -> None:
    enc = Encoder()
    dec = hpack.Decoder()
    enc.set_max_table_size(table)
    dec.max_allowed_table_size = min(table, 4096)
    for headers in blocks:
        assert dec.decode(enc.encode(headers), raw=True) == headers


@settings(max_examples=8, deadline=None)
@given(st.lists(header_lists, min_size=1, max_size=8), st.booleans())
def test_hpack_encoder_with_our_decoder(blocks: list, huffman: bool) -> None:
    enc = hpack.Encoder()
    dec = Decoder()
    for headers in blocks:
        got, size = dec.decode(enc.encode(headers, huffman=huffman), 1 << 30)
        assert got == headers
        assert size == sum(len(n) + len(v) + 32 for n, v in headers)


def _conversation() -> tuple[bytes, list]:
    """A client's bytes for a few requests with bodies, a ping and a reset."""
    c = H2Connection(H2Configuration(client_side=True, header_encoding=None))
    c.initiate_connection()
    for i in range(4):
        sid = c.get_next_available_stream_id()
        if i % 2:
            c.send_headers(sid, [*post(6), (b"x-i", b"%d" % i)])
            c.send_data(sid, b"abc", pad_length=3)
            c.send_data(sid, b"def", end_stream=True)
        else:
            c.send_headers(sid, [*GET[:3], (b":path", b"/%d" % i)], end_stream=True)
    c.ping(b"pingping")
    c.reset_stream(1)
    data = c.data_to_send()
    server = H2Server()
    server.initiate()
    return data, server.receive(data, 0.0)


_DATA, _EVENTS = _conversation()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(_DATA)), max_size=30))
def test_chunking_gives_the_same_events(cuts: list[int]) -> None:
    server = H2Server()
    server.initiate()
    events: list = []
    bounds = [0, *sorted(cuts), len(_DATA)]
    for a, b in itertools.pairwise(bounds):
        events += server.receive(_DATA[a:b], 0.0)
    assert events == _EVENTS
    kinds = [type(e).__name__ for e in _EVENTS]
    assert kinds.count("RequestReceived") == 4 and kinds.count("DataReceived") == 4
    assert kinds[-1] == "StreamReset" and not server.closed


def test_responses_decode_in_the_h2_client_after_table_size_change() -> None:
    p = Pair()
    p.client.update_settings({SettingCodes.HEADER_TABLE_SIZE: 100})
    p.pump()
    for _ in range(3):
        sid = p.request()
        p.pump()
        p.server.send_headers(sid, 200, [(b"x-long-name", b"v" * 40), (b"server", b"l")],
                              end_stream=True)
        _, cli = p.pump()
        assert [e for e in cli if isinstance(e, ce.ResponseReceived)]
