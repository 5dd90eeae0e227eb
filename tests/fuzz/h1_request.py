"""Fuzz target: bytes from a client into the real HTTP/1.1 downstream codec (``H1Downstream``)
on the fake loop and transport of tests/playbook.py, split into reads as the input says.

Invariants (any breach raises, which the fuzzer reports as a crash):

- nothing escapes ``data_received``: a bad request is answered (4xx/5xx) and closed, never a
  traceback;
- what the codec wrote parses, with h11 (an independent reader), as a sequence of complete
  HTTP/1.1 responses (RFC 9112 §6: each one framed so the client finds its end);
- what was forwarded upstream re-parses (httptools) as exactly one request per forward, with
  the framing the codec announced (RFC 9112 §6.3: Content-Length matches the body; chunked
  when the body was chunked), and never more requests than llhttp finds in the client's bytes
  (no request smuggled in);
- the connection ends, and nothing is left on the books once it has.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import h11
import httptools

from lameduck.http1.downstream import H1Downstream
from lameduck.http1.upstream import request_head
from lameduck.http1.wire import STAND_IN, extension_method
from tests import playbook
from tests.playbook import Connecting, Transport, Upstream

MAX_INPUT = 1 << 14  # larger inputs are cut: the interesting bugs are in the framing


class Forward:
    """One request as the exchange handed it to an upstream connection."""

    def __init__(self, head: bytes, no_body: bool, chunked: bool) -> None:
        self.head = head
        self.no_body = no_body
        self.chunked = chunked
        self.body = bytearray()
        self.ended = False
        self.answered = False


class RecordingUpstream(Upstream):
    """The playbook's upstream, keeping each request apart (a reused connection sends several)."""

    def __init__(self, endpoint: Any, multiplexed: bool = False) -> None:
        super().__init__(endpoint, multiplexed)
        self.forwards: list[Forward] = []

    def start(self, sink: Any, head: Any) -> None:
        """The head as the HTTP/1.1 upstream formats it (the bytes an origin would read)."""
        super().start(sink, head)
        self.forwards.append(Forward(request_head(head), head.method == b"HEAD", head.chunked))

    def write(self, data: bytes) -> None:
        super().write(data)
        self.forwards[-1].body += data

    def end(self, trailers: list[tuple[bytes, bytes]] | None, timeout: float,
            idle_timeout: float) -> None:
        super().end(trailers, timeout, idle_timeout)
        self.forwards[-1].ended = True


class RecordingConnecting(Connecting):
    def succeed(self, multiplexed: bool = False) -> Upstream:
        self.conn = RecordingUpstream(self.endpoint, multiplexed)
        for cb in self.callbacks:
            cb(self)
        return self.conn


class Listener(playbook.Listener):
    """The playbook's listener, its upstream connections recorded."""

    def __init__(self) -> None:
        super().__init__(lambda: 0.5)
        self.max_request_headers = 8 * 1024
        self.ups: list[RecordingUpstream] = []

    def connect(self, cluster: Any, endpoint: Any) -> Connecting:
        c = RecordingConnecting(endpoint)
        self.connects.append(c)
        return c


def split(data: bytes) -> tuple[list[bytes], bytes]:
    """The first two bytes seed where the reads are cut; the rest are the client's bytes."""
    rng = random.Random(data[:2])
    body = data[2:MAX_INPUT]
    reads: list[bytes] = []
    pos = 0
    while pos < len(body):
        n = rng.choice((1, 2, 7, 64, 1 << 20))
        reads.append(body[pos:pos + n])
        pos += n
    return reads, body


def serve(ls: Listener) -> None:
    """Play the upstream: connect at once, answer each request once it has all been sent."""
    for c in ls.connects:
        if not c.done():
            ls.ups.append(c.succeed())  # type: ignore[arg-type]
    for up in ls.ups:
        for fw in up.forwards:
            if not fw.answered and (fw.no_body or fw.ended) and up.sink is not None:
                fw.answered = True
                up.sink.on_response_head(200, [(b"Content-Length", b"2")], 2, False)
                if not fw.head.startswith(b"HEAD "):  # RFC 9110 §9.3.2: no content
                    up.sink.on_response_body(b"ok")
                up.sink.on_response_complete()


def client_requests(body: bytes) -> list[bytes]:
    """The methods of the requests llhttp finds in the client's bytes (up to an error). A
    request line that is not HTTP/1.x (no version: HTTP/0.9; or 2.0) ends them: llhttp takes
    it, the codec answers it 400/505 with a body whatever its method (RFC 9112 §2.3, §3). A
    request whose method llhttp refuses but is a token is an extension method (RFC 9110 §9.1):
    the codec forwards it when it begins a read, else answers it 400 — either way the answer
    is to that method, so it is read here as a request wherever it begins."""
    methods: list[bytes] = []
    ends: list[int] = []  # where each message ended (only while feeding byte by byte)
    fed = [0]

    upgrade: list[bytes | None] = [None, None]  # the request's Upgrade, Connection

    class Cb:
        def on_header(self, name: bytes, value: bytes) -> None:
            n = name.lower()
            if n == b"upgrade":
                upgrade[0] = value
            elif n == b"connection":
                upgrade[1] = (upgrade[1] or b"") + b"," + value

        def on_headers_complete(self) -> None:
            if parser.get_http_version()[0] != "1":
                methods.append(b"GET")  # answered with a body, and the last one
                raise EOFError
            methods.append(parser.get_method())

        def on_message_complete(self) -> None:
            ends.append(fed[0])

    rest = body
    while True:
        upgrade[:] = [None, None]
        parser = httptools.HttpRequestParser(Cb())
        try:
            parser.feed_data(rest)
            return methods
        except httptools.HttpParserInvalidMethodError:
            break
        except httptools.HttpParserUpgrade as e:
            # A GET's WebSocket Upgrade hands the connection to the tunnel, and a CONNECT to
            # its destination; any other Upgrade the codec strips (RFC 9110 §7.8: a server
            # may ignore it) and reads on, the next request from where llhttp stopped.
            if tunnels(methods, upgrade) or not e.args:
                return methods
            rest = rest[e.args[0]:]
            if not rest:
                return methods
        except httptools.HttpParserError:
            return methods
    # Again, a byte at a time, so that where a refused method begins is known.
    methods.clear()
    parser = httptools.HttpRequestParser(Cb())
    start = 0
    i = 0
    while i < len(body):
        fed[0] = i + 1
        try:
            parser.feed_data(body[i:i + 1])
        except httptools.HttpParserInvalidMethodError:
            begin = ends[-1] if ends else start
            ext = extension_method(body[begin:])
            if ext is None:
                return methods
            method, rest = ext
            extended = len(methods)
            parser = httptools.HttpRequestParser(Cb())
            with contextlib.suppress(httptools.HttpParserError, httptools.HttpParserUpgrade):
                parser.feed_data(rest)
            if len(methods) > extended and methods[extended] == STAND_IN:
                methods[extended] = method
            return methods
        except httptools.HttpParserUpgrade:
            if tunnels(methods, upgrade):
                return methods
            # stripped, as above: the next request begins after this head
            ends.append(i + 1)
            upgrade[:] = [None, None]
            parser = httptools.HttpRequestParser(Cb())
        except httptools.HttpParserError:
            return methods
        i += 1
    return methods


def tunnels(methods: list[bytes], upgrade: list[bytes | None]) -> bool:
    """The request llhttp stopped at hands the connection over: a GET's WebSocket Upgrade
    (to the tunnel) or a CONNECT (to its destination). ``upgrade``: its Upgrade and
    Connection values."""
    up, conn = upgrade
    websocket = (up is not None and up.strip().lower() == b"websocket"
                 and b"upgrade" in [t.strip().lower() for t in (conn or b"").split(b",")])
    return (websocket and methods[-1:] == [b"GET"]) or methods[-1:] == [b"CONNECT"]


def check_responses(out: bytes, methods: list[bytes]) -> int:
    """Read ``out`` as the client would (h11), asking what llhttp parsed, in order; the number
    of complete responses. Raises if a response is malformed or ends mid-way."""
    client = h11.Connection(h11.CLIENT)
    client.receive_data(out)
    client.receive_data(b"")  # the connection has ended: a response must be complete
    count = 0
    while True:
        if count:
            if client.their_state is not h11.DONE or client.our_state is not h11.DONE:
                # Connection: close (or HTTP/1.0): nothing may follow this response.
                rest = client.trailing_data[0]
                assert not rest, f"bytes after a closing response: {rest!r}"
                return count
            client.start_next_cycle()
        if not client.trailing_data[0]:
            return count
        method = methods[count] if count < len(methods) else b"GET"
        client.send(h11.Request(method="HEAD" if method == b"HEAD" else "GET", target="/",
                                headers=[("host", "a")]))
        client.send(h11.EndOfMessage())
        while True:
            ev = client.next_event()
            if ev is h11.NEED_DATA or isinstance(ev, h11.ConnectionClosed):
                raise AssertionError(f"response {count} cut short: {out!r}")
            if isinstance(ev, h11.EndOfMessage):
                break
        count += 1


class Reparse:
    """httptools callbacks: the body of each request found."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def on_headers_complete(self) -> None:
        self.bodies.append(b"")

    def on_body(self, b: bytes) -> None:
        self.bodies[-1] += b


def check_forwards(ls: Listener, methods: list[bytes]) -> None:
    forwards = [fw for up in ls.ups for fw in up.forwards]
    assert len(forwards) <= len(methods), (
        f"{len(forwards)} forwarded, llhttp sees {len(methods)} requests")
    for fw in forwards:
        cb = Reparse()
        seen = cb.bodies
        p = httptools.HttpRequestParser(cb)
        wire = fw.head
        if fw.chunked:
            body = bytes(fw.body)
            wire += (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
        else:
            wire += bytes(fw.body)
        ext = extension_method(wire)
        if ext is not None:  # a forwarded extension method: re-parsed as the codec parsed it
            wire = ext[1]
        try:
            p.feed_data(wire)  # raises if the head we built does not parse
        except httptools.HttpParserUpgrade:
            # RFC 9110 §7.8: only the WebSocket upgrade the codec relays on purpose
            assert b"\r\nupgrade: websocket\r\n" in fw.head, fw.head
        assert len(seen) == 1, f"forwarded head parses as {len(seen)} requests: {fw.head!r}"
        assert seen[0] == bytes(fw.body), fw.head


def fuzz_one(data: bytes) -> None:
    """The target: one connection's life from these bytes."""
    reads, body = split(data)
    ls = Listener()
    conn = H1Downstream(ls)
    t = Transport(ls.loop)
    conn.connection_made(t)
    for r in reads:
        if t.closed_at is not None or t.eof_at is not None:
            break
        conn.data_received(r)
        ls.loop.run_soon()
        serve(ls)
        ls.loop.run_soon()
    if t.closed_at is None:
        if not conn.eof_received():
            t.close()
            conn.connection_lost(None)
        serve(ls)
    ls.loop.advance(ls.loop.now + 1000.0)
    if t.closed_at is None:
        t.close()
        conn.connection_lost(None)
    ls.loop.advance(ls.loop.now + 1000.0)
    methods = client_requests(body)
    check_responses(t.out, methods)
    check_forwards(ls, methods)
    assert ls.process.ledger.active == 0, "a request left on the books"
