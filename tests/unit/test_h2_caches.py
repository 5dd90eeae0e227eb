"""The per-field caches behind H2Server's hot path: request validation, response names and
the encoder's fixed encodings. A cached answer must never let a different field through, and
no cache may grow past its bound whatever the client sends."""

from __future__ import annotations

import h2.events as ce
import hpack
import pytest
from hyperframe.frame import HeadersFrame

from lameduck.http2 import codec, connection
from lameduck.http2.codec import Encoder
from lameduck.http2.connection import ErrorCode, RequestReceived, StreamReset, TrailersReceived
from lameduck.proxy import sections
from tests.unit.test_h2_connection import GET, Pair, Raw

EHS = ["END_HEADERS", "END_STREAM"]
EH = ["END_HEADERS"]


def accepted(raw: Raw, sid: int, headers: list[tuple[bytes, bytes]]) -> bool:
    ev = raw.send(HeadersFrame(sid, raw.block(headers), flags=EHS))
    if any(isinstance(e, RequestReceived) for e in ev):
        return True
    assert StreamReset(sid, ErrorCode.PROTOCOL_ERROR) in ev, ev
    return False


@pytest.mark.parametrize(("good", "bad"), [
    ((b"x", b"a"), (b"x", b"a\r\nb")),
    ((b"x", b"a"), (b"x", b"a ")),
    ((b"x", b"a"), (b"X", b"a")),
    ((b"te", b"trailers"), (b"te", b"gzip")),
    ((b"content-length", b"0"), (b"content-length", b"0x")),
])
def test_a_cached_field_does_not_vouch_for_another(good: tuple[bytes, bytes],
                                                   bad: tuple[bytes, bytes]) -> None:
    raw = Raw()
    assert accepted(raw, 1, [*GET, good])
    assert accepted(raw, 3, [*GET, good])  # now from the cache
    assert not accepted(raw, 5, [*GET, bad])
    assert accepted(raw, 7, [*GET, good])


def test_cached_kinds_still_meet_the_rules_between_fields() -> None:
    raw = Raw()
    assert accepted(raw, 1, [*GET, (b"accept", b"*/*")])
    # The same fields, each known good, in an order or number that is malformed.
    assert not accepted(raw, 3, [GET[0], (b"accept", b"*/*"), *GET[1:]])
    assert not accepted(raw, 5, [*GET, GET[0]])
    assert not accepted(raw, 7, GET[1:])  # no :method
    assert accepted(raw, 9, [(b":method", b"OPTIONS"), (b":scheme", b"https"), (b":path", b"*")])
    assert not accepted(raw, 11, [GET[0], (b":scheme", b"https"), (b":path", b"*")])
    assert not accepted(raw, 13, [(b":method", b"CONNECT"), GET[2], GET[3]])


def test_field_cache_stays_bounded() -> None:
    raw = Raw()
    for i in range(sections.CACHE_MAX + 50):
        sid = 2 * i + 1
        assert accepted(raw, sid, [*GET, (b"x-n", b"%d" % i)])
        raw.server.reset_stream(sid)
        assert len(sections.FIELD_KINDS) <= sections.CACHE_MAX
    long = (b"x-long", b"v" * (sections.CACHE_ENTRY_MAX + 1))
    assert accepted(raw, 2 * i + 3, [*GET, long])
    assert long not in sections.FIELD_KINDS


def test_trailers_use_the_cache_but_not_for_pseudo_fields() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block([*GET[:3], (b":path", b"/a"), (b"x", b"1")]), flags=EH))
    ev = raw.send(HeadersFrame(1, raw.block([(b"x", b"1")]), flags=EHS))
    assert [type(e) for e in ev] == [TrailersReceived]
    raw.send(HeadersFrame(3, raw.block([*GET[:3], (b":path", b"/b")]), flags=EH))
    ev = raw.send(HeadersFrame(3, raw.block([(b":path", b"/b")]), flags=EHS))
    assert StreamReset(3, ErrorCode.PROTOCOL_ERROR) in ev


def test_response_names_lowered_and_filtered_every_time() -> None:
    p = Pair()
    for _ in range(3):
        sid = p.request()
        p.pump()
        p.server.send_headers(sid, 200, [(b"X-Up", b"1"), (b"Connection", b"close"),
                                         (b"content-length", b"0")], end_stream=True)
        _, cli = p.pump()
        resp = next(e for e in cli if isinstance(e, ce.ResponseReceived))
        assert resp.headers == [(b":status", b"200"), (b"x-up", b"1"),
                                (b"content-length", b"0")]
    assert sections.OUT_NAMES[b"Connection"] == b""


def test_response_name_cache_stays_bounded() -> None:
    for i in range(sections.CACHE_MAX + 10):
        sections.out_name(b"X-%d" % i)
        assert len(sections.OUT_NAMES) <= sections.CACHE_MAX


def test_encoder_fixed_encodings_decode_right_and_stay_bounded() -> None:
    enc = Encoder()
    dec = hpack.Decoder()
    for i in range(codec._FIXED_MAX + 20):
        fields = [(b":status", b"200"), (b"content-length", b"%d" % (i % 7)),
                  (b"x-request-id", b"%d" % i), (b"server", b"s")]
        assert dec.decode(enc.encode(fields), raw=True) == fields
        assert len(codec._FIXED) <= codec._FIXED_MAX
    assert all(codec._FIXED[f] == v for f, v in codec._STATIC_BYTES.items())
    assert enc.encode([(b":status", b"200")]) == b"\x88"


def test_closed_stream_memory_is_a_bounded_fifo() -> None:
    raw = Raw()
    total = connection._CLOSED_MEMORY + 10
    for i in range(total):
        sid = 2 * i + 1
        raw.send(HeadersFrame(sid, raw.block(GET), flags=EHS))
        raw.server.reset_stream(sid)
    closed = raw.server._closed_ids
    assert len(closed) == connection._CLOSED_MEMORY
    assert 1 not in closed and 19 not in closed and 21 in closed and 2 * total - 1 in closed
    # A remembered stream is known as closed; a forgotten one looks like a reused id.
    ev = raw.send(HeadersFrame(21, raw.block(GET), flags=EHS))
    assert ev == [] and not raw.server.closed  # reset by us: in-flight HEADERS ignored
    ev = raw.send(HeadersFrame(19, raw.block(GET), flags=EHS))
    assert raw.server.closed and ev[-1].code == ErrorCode.PROTOCOL_ERROR


def test_huffman_strings_are_decoded_once_and_a_bad_one_is_never_cached() -> None:
    """nginx codes each response field as a Huffman literal, never indexed: the same coded
    bytes come on every response and are decoded once. The cache is keyed by those bytes, so
    it answers exactly what decoding would, and a coding error is raised every time."""
    enc = hpack.Encoder()
    block = enc.encode([(b"server", b"nginx"), (b"content-type", b"text/plain")],
                       huffman=True)
    codec._HUFFMAN.clear()
    want = [(b"server", b"nginx"), (b"content-type", b"text/plain")]
    assert codec.Decoder().decode(block, 1 << 16)[0] == want
    cached = dict(codec._HUFFMAN)
    assert b"nginx" in cached.values() and b"text/plain" in cached.values()
    assert codec.Decoder().decode(block, 1 << 16)[0] == want  # from the cache now
    # an invalid Huffman string (EOS inside): refused, and not remembered
    bad = b"\x00\x81\xff"  # literal, new name: a 1-byte Huffman-coded name of all ones
    for _ in range(2):
        with pytest.raises(codec.DecodeError):
            codec.Decoder().decode(bad, 1 << 16)
    assert codec._HUFFMAN.keys() == cached.keys()
    # bounded: a peer sending endless distinct strings never grows it past its size
    codec._HUFFMAN.clear()
    for i in range(codec.HUFFMAN_CACHE_MAX + 10):
        codec._huffman(hpack.huffman.HuffmanEncoder(
            hpack.huffman_constants.REQUEST_CODES,
            hpack.huffman_constants.REQUEST_CODES_LENGTH).encode(b"v%d" % i))
    assert len(codec._HUFFMAN) <= codec.HUFFMAN_CACHE_MAX
