"""HTTP/1.1 downstream connection: parse with httptools, hand each request to a
``proxy.exchange.Exchange``, write what it decides as HTTP/1.1 (the ``DownstreamPort``), and
carry out the drain core's decisions for this connection.

Requests are answered in order: only the head of the queue talks to an upstream; pipelined
requests behind it wait with reading paused. Bodies stream both ways with flow control
(pause_reading / resume_reading); nothing buffers a whole body. Once the request whose answer
closes the connection has been read, nothing after it is parsed (no request smuggled behind a
400, a 501 or a ``Connection: close`` reaches an upstream).

Drain (docs/drain.md): ``ConnectionDrain.on_response`` decides per response whether to add
``Connection: close``; one lazily re-armed timer covers the header timeout, the idle timeout
and the drain moments; a close is staged (shutdown write, drain reads briefly, close) so the
last response is not lost to a reset (RFC 9112 §9.6).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Final, Protocol, cast

import httptools
from mypy_extensions import i64

from lameduck.drain import DrainedBy
from lameduck.drain.tunnel import Flow, TunnelKind
from lameduck.http1.wire import (
    LAST_CHUNK,
    absolute_form,
    chunk,
    extension_method,
    simple_response,
    status_line,
)
from lameduck.proxy.accesslog import DPE
from lameduck.proxy.downstream import STOP, Downstream, HttpConnectionContext
from lameduck.proxy.exchange import Exchange
from lameduck.proxy.fields import trailer_block, trailer_fields
from lameduck.proxy.local import CUT_ANSWER, CUT_DROPPED, GOING_AWAY_BODY, RETRY_AFTER
from lameduck.proxy.message import (
    HTTP10,
    HTTP11,
    SERVICE_TIME,
    RequestHead,
    service_time_line,
)
from lameduck.stats import HttpStats
from lameduck.tunnel.relay import Pending, Relay, destination, open_destination
from lameduck.upstream.connector import Fields, UpstreamConn

log = logging.getLogger("lameduck.http1")

# Reasons reading is paused; reading resumes when none is left.
PAUSE_PIPELINE = 1  # a request waits behind the one being answered
PAUSE_BODY = 2  # the upstream cannot take the request body faster, or is not there yet
PAUSE_CLOSING = 8
PAUSE_UPGRADE = 16  # an Upgrade request waits for the upstream's answer

GOING_AWAY = simple_response(503, GOING_AWAY_BODY, close=True, extra=RETRY_AFTER)
GOING_AWAY_HEAD = simple_response(503, GOING_AWAY_BODY, close=True, extra=RETRY_AFTER,
                                  head_only=True)
# An HTTP/2 client with prior knowledge opens with this (RFC 9113 §3.4).
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class ListenerContext(HttpConnectionContext, Protocol):
    """What an HTTP/1.1 connection needs from its listener (wired in ``listeners``)."""

    name: str
    request_headers_timeout: float
    max_request_headers: int

    def upgrade_h2(self, conn: H1Downstream, data: bytes) -> bool:
        """The connection opened with the HTTP/2 preface (``data`` holds all bytes read so
        far): True if the listener took it over (it calls ``conn.hand_over()``), False to
        read it as HTTP/1."""
        ...


class HeaderTooLarge(Exception):
    pass


class Reader:
    """The request side of a connection: an llhttp parser (through httptools, which keeps a
    bound method of each callback below, made when the parser is) and what it has read of the
    request in progress, for the connection that holds it now (``conn``).

    An idle keep-alive connection holds none: it gives its reader back (``READERS``) when its
    last exchange ends and takes one when its next bytes come. The parser, its llhttp state
    and its six bound methods (about 1 KiB) are then held per request in flight, not per open
    connection, as nginx frees an idle keep-alive connection's request and keeps only the
    connection (``ngx_http_set_keepalive``). The callbacks are the reader's own, so a reader
    moves from one connection to the next with one field store, and reaches the connection
    with one field load. Between requests llhttp keeps nothing of the message before but its
    version (see ``H1Downstream.data_received``)."""

    def __init__(self) -> None:
        self.conn: H1Downstream | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.next: Reader | None = None  # the one given back before it (``Readers``)
        self.url = b""
        self.fields: Fields = []  # the request's fields as received
        # The two framing fields, as the parser met them: Transfer-Encoding (several fields
        # are one list, RFC 9110 §5.3) and Content-Length (llhttp checked it is one number).
        self.te: bytes | None = None
        self.length: bytes | None = None
        self.room = 0  # bytes the head may still take (max_request_headers)
        self.trailers: Fields | None = None  # the trailer section of a chunked request body

    def on_message_begin(self) -> None:
        conn = self.conn
        assert conn is not None  # (a reader is fed only by the connection holding it)
        conn.first_in_read = conn.rfirst
        conn.rfirst = False  # the next request in this read does not start at its first byte
        self.url = b""
        self.fields = []
        self.te = self.length = None
        self.room = conn.max_headers
        self.trailers = None
        conn.raw_head_bytes = -1
        conn.in_headers = True
        conn.req_started = now = conn.loop.time()
        at = now + conn.headers_timeout
        if conn.timer is None or at < conn.timer_at:
            conn.arm(at)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.room -= len(url)
        if self.room < 0:
            raise HeaderTooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        self.room -= len(name) + len(value) + 4
        if self.room < 0:
            raise HeaderTooLarge
        conn = self.conn
        assert conn is not None
        if not conn.in_headers:  # a trailer field after a chunked body
            if conn.reading is not None:
                if self.trailers is None:
                    self.trailers = []
                self.trailers.append((name, value))
            return
        size = len(name)
        if size == 17 or size == 14:  # the framing fields' lengths: lower only those
            n = name.lower()
            if n == b"transfer-encoding":  # re-framed by the codec, never forwarded as is
                self.te = value if self.te is None else self.te + b"," + value
                return
            if n == b"content-length":
                self.length = value
        self.fields.append((name, value))

    def on_headers_complete(self) -> None:
        """The head is read: its exchange begins."""
        conn = self.conn
        assert conn is not None
        conn.in_headers = False
        if conn.last_read:
            return  # pipelined behind the last request this connection answers: dropped
        parser = self.parser
        method = parser.get_method()
        version = conn._version(method, self)
        ext = conn.ext_method
        if ext is not None:
            method = ext
            conn.ext_method = None
        v10 = version == "1.0"
        # llhttp takes HTTP/0.9 (no version) and 2.0 request lines; neither is HTTP/1.x (0),
        # so neither is a HEAD whose answer has no content: the 400/505 carries its body, as it
        # does when the line is refused before its fields (``_http09``).
        ex = H1Exchange(conn, method, HTTP10 if v10 else HTTP11 if version == "1.1" else 0)
        ex.head_received(conn.req_started, self.url, self.fields, None, conn.log_on)
        if not parser.should_keep_alive():
            ex.keep_alive = False
        conn.reading = ex
        conn.body_at = conn.req_started  # a field store: no clock read on the fast path
        queue = conn.queue
        queue.append(ex)
        st = conn.stats  # typed: the counters are struct fields, not attributes by name
        st.downstream_rq_total += 1
        st.downstream_rq_http1_total += 1
        st.downstream_rq_active += 1
        if conn.count_request():
            ex.close = True  # nothing behind it is read: its response closes the connection
        if ex.version:
            conn._prepare(ex, method, self)
        else:
            ex.close = True
            ex.malformed()
            ex.answer_local(505 if version >= "2" else 400,
                            b"http version not supported\n" if version >= "2"
                            else b"bad request\n")
        if len(queue) == 1:
            conn._begin(ex)
        else:
            conn.pause(PAUSE_PIPELINE)

    def on_body(self, body: bytes) -> None:
        conn = self.conn
        assert conn is not None
        ex = conn.reading
        if ex is not None:
            conn.body_at = now = conn.loop.time()
            conn.arm(now + conn.body_timeout)  # no-op unless earlier than the timer's
            ex.request_body(body, 0)

    def on_message_complete(self) -> None:
        conn = self.conn
        assert conn is not None
        ex = conn.reading
        conn.reading = None
        if ex is not None:
            if ex.upgrade or ex.connect is not None:
                conn.upgrading = ex  # llhttp raises HttpParserUpgrade right after this
            elif ex.close or not ex.keep_alive:
                # Its response closes the connection: requests pipelined behind it will not
                # be answered, so they are not read (nor sent upstream).
                conn.last_read = True
            trailers = None
            received = self.trailers  # (None unless a trailer field came)
            if received is not None:
                trailers = trailer_fields(received) or None
                self.trailers = None
            ex.request_complete(trailers)


class Readers:
    """Readers given back by idle connections, taken by those whose next request begins: a
    stack linked through the readers (a list would free its array when it empties and
    allocate it again, some 300 instructions each way when one connection alternates). The
    last given back is taken first, its memory the likeliest to be in cache. At most
    ``READERS_KEPT`` stay: more were in use at once only in a burst."""

    def __init__(self) -> None:
        self.top: Reader | None = None
        self.count: i64 = 0


READERS_KEPT: Final[i64] = 128
READERS: Final = Readers()  # the process's (readers hold no loop: shared by its listeners)


class H1Exchange(Exchange):
    """An exchange with what only HTTP/1.1 keeps per request: whether its response ends the
    connection, how that response is framed, and an answer queued behind earlier ones."""

    close = False  # the connection closes after this response
    keep_alive = True  # the client did not ask to close (llhttp's should_keep_alive)
    resp_chunked = False  # the response goes out chunked (no length from the upstream)
    reply: bytes | None = None  # answered here: the bytes, sent when its turn comes
    early = b""  # bytes the client sent after an Upgrade request, before the 101


class H1Downstream(Downstream):
    """One client connection."""

    ext_method: bytes | None = None  # the extension method of the request being parsed

    def __init__(self, ctx: ListenerContext) -> None:
        super().__init__(ctx)
        self.stats: HttpStats = ctx.stats
        self.headers_timeout = ctx.request_headers_timeout
        self.max_headers = ctx.max_request_headers
        self.take_limits(ctx)
        self.body_at = 0.0  # the last byte of the request body being read (or its head's start)
        self.rd: Reader | None = None  # the request parser, while a request is in flight
        # A list, not a deque: an empty deque allocates a 64-slot block (~630 bytes per idle
        # connection); reading pauses behind the head (PAUSE_PIPELINE), so the queue stays
        # a few entries long and pop(0) is cheap.
        self.queue: list[H1Exchange] = []
        self.reading: H1Exchange | None = None  # the exchange whose request is being received
        self.paused = 0
        self.wbuf: list[bytes] | None = None  # writes held while corked (see flush)
        self.raw_head_bytes = 0  # bytes of a request head still incomplete after a read
        self.req_started = 0.0
        self.sniffed = b""  # the first bytes, while they are a strict prefix of the preface
        self.upgrading: H1Exchange | None = None  # an Upgrade request awaiting its answer
        self.relay: Relay | None = None  # the tunnel this connection became (after a 101)
        # The read being parsed, and whether its first request begins at its first byte: then
        # that request's version can be read off its request line (see ``_version``).
        self.rdata = b""
        # The flags last and together: compiled, each is a byte of the connection's struct,
        # which fields of 8 bytes between them would pad to 8.
        self.rfirst = False
        self.first_in_read = False  # the request being read began its read (``rfirst``)
        self.last_read = False  # the last request this connection will answer has been read
        self.in_headers = False
        self.log_on = ctx.access_log is not None
        self.first_read = True  # until the HTTP/2 preface is ruled out (see ``_sniff``)

    # -- asyncio ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.opened(transport, self.accepted())
        self.stats.downstream_cx_http1_active += 1
        self.arm_drain()

    def data_received(self, data: bytes) -> None:
        if self.closing or self.last_read:
            return
        pending = self.upgrading  # a local: narrowing self.upgrading would outlive feed_data
        if pending is not None:
            pending.early += data  # read before the pause took effect
            return  # a staged close drains what the client still sends; so does the tail
        if self.first_read:
            data = self._sniff(data)
            if not data:
                return
        # At a message boundary (nothing of a request pending), a request begun in this read
        # starts at its first byte (or after blank lines llhttp skips).
        rd = self.rd
        if rd is None:
            # A reader for the request that begins: one an idle connection gave back, or a new
            # one for a connection's first request. llhttp keeps the version of the last
            # request it parsed (until a request line names another), and ``_http09`` tells an
            # HTTP/0.9 request line by the version a parser that has parsed nothing reports.
            pool = READERS
            rd = pool.top
            if rd is None or self.unseen:
                rd = Reader()
            else:
                pool.top = rd.next  # (its ``next`` is left: overwritten when it is given back)
                pool.count -= 1
            rd.conn = self
            self.rd = rd
        self.rfirst = rfirst = self.reading is None and not self.in_headers
        self.rdata = data
        try:
            rd.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            offset = e.args[0] if e.args else len(data)
            upgrading = self.upgrading  # set by on_message_complete, inside feed_data
            if upgrading is not None:
                # A WebSocket Upgrade: what follows is for the tunnel, if the upstream agrees.
                upgrading.early += data[offset:]
                self.pause(PAUSE_UPGRADE)
                self.rdata = b""
                return
            # The request was complete (a stripped Upgrade or a refused CONNECT); what
            # follows is either a new request or tunnel bytes we do not relay.
            rd.parser = httptools.HttpRequestParser(rd)
            self.rdata = b""
            rest = data[offset:]
            if rest and not self.closing and not self.last_read:
                self.data_received(rest)
            return
        except httptools.HttpParserCallbackError as e:
            if isinstance(e.__context__, HeaderTooLarge):
                self.protocol_error(431, b"request header fields too large\n")
            else:
                log.exception("error in request handling")
                self.protocol_error(400, b"bad request\n")
        except httptools.HttpParserInvalidMethodError:
            # Only a request that began this read (its method is where the read begins) can be
            # parsed again with a stand-in method; later in a read the error has no offset.
            ext = extension_method(data) if rfirst else None
            if ext is None:
                self.protocol_error(400, b"bad request\n")
                return
            self.ext_method, data = ext
            rd.parser = httptools.HttpRequestParser(rd)
            self.data_received(data)
            return
        except httptools.HttpParserError:
            self.protocol_error(400, b"bad request\n")
            return
        self.rdata = b""  # not kept past its read
        if self.in_headers:
            if rd.url and self._http09(data, rd):
                self.protocol_error(400, b"bad request\n")
                return
            # llhttp keeps a header that has not ended yet in its own buffer, out of sight of
            # on_header: bound the head by the bytes that went in too (whole reads spent inside
            # one head; the read it began in is not counted, so this errs by one read at most).
            if self.raw_head_bytes < 0:
                self.raw_head_bytes = 0  # began in this read
            else:
                self.raw_head_bytes += len(data)
                if self.raw_head_bytes > self.ctx.max_request_headers:
                    self.protocol_error(431, b"request header fields too large\n")
        elif not self.queue:
            self._give_reader()  # nothing in flight (answered here within the read, or blank lines)

    def _give_reader(self) -> None:
        """Nothing of a request is in flight: the reader goes back for the next connection whose
        request begins. Not when this connection reads no more: llhttp refuses bytes after a
        message that ends its connection, and one cut mid-message is not at a boundary."""
        rd = self.rd
        if rd is None:
            return
        self.rd = None
        rd.conn = None
        if not (self.closing or self.last_read):
            pool = READERS
            if pool.count < READERS_KEPT:
                rd.next = pool.top
                pool.top = rd
                pool.count += 1

    def _http09(self, data: bytes, rd: Reader) -> bool:
        """An HTTP/0.9 request line (``GET /`` and a newline, no version): llhttp takes it and
        waits for fields that never come, so it would be held to the header timeout. HTTP/1.x
        needs a version (RFC 9112 §3): answered 400 at once and closed. Only a request
        line ended after its target and before any version does this (a version, once read,
        is kept for the connection's later requests)."""
        end = data.rfind(b"\n")
        return (end > data.rfind(rd.url[-1:])
                and rd.parser.get_http_version() == "0.0")

    def _sniff(self, data: bytes) -> bytes:
        """The first read(s): an HTTP/2 prior-knowledge preface goes to the listener. Returns
        the bytes to parse as HTTP/1 (empty: held as a strict prefix of the preface, or taken
        over)."""
        if self.sniffed:
            data = self.sniffed + data
            self.sniffed = b""
        if len(data) < len(H2_PREFACE) and H2_PREFACE.startswith(data):
            self.sniffed = data  # "PRI * HT", or just "P" of a POST: wait for more
            return b""
        self.first_read = False
        if data[:len(H2_PREFACE)] == H2_PREFACE and self.ctx.upgrade_h2(self, data):
            return b""
        return data

    def hand_over(self) -> None:
        """The listener took this connection over (HTTP/2): stop the timers and ignore every
        later callback. The listener updates its connection set and gauges itself."""
        self.gone = True
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def eof_received(self) -> bool:
        """The client half-closed: HTTP/1.1 gives that no meaning of its own (RFC 9112 §9.6
        has a client close when it is done), and a client that gives up waiting sends just
        this FIN. As Envoy's connection manager (which takes a downstream FIN for the
        connection's end) and nginx (499), what is still in flight ends here as the client's
        going away (``Exchange.client_gone``: its upstream request cut); the connection
        closes (False: asyncio closes the transport)."""
        if self.gone:
            return True  # handed over: the transport is not ours to close
        if not self.closing and self.queue:
            if self.reading is not None:
                # in the middle of a request body: that request can never complete
                self.ctx.stats.downstream_rq_rx_reset += 1
            self.closing = True
            self._clients_gone()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.gone:  # else handed over (see ``hand_over``): no longer ours
            rd = self.rd
            if rd is not None:  # cut mid-request: this reader is not at a message boundary
                self.rd = None
                if not self.rdata:  # (not inside its parser, whose callbacks still come)
                    rd.conn = None
            super().connection_lost(exc)

    def abandon_all(self) -> None:
        self.stats.downstream_cx_http1_active -= 1
        self._clients_gone()

    def _clients_gone(self) -> None:
        """The connection ended (or the client half-closed) with requests in flight: each ends
        by the exchange's rule, off the books unanswered."""
        queue = self.queue
        if not queue:
            return
        self.queue = []
        self.reading = None
        self.clients_gone(queue)
        for ex in queue:
            ex.settle(False)

    def busy(self) -> bool:
        """A request is being read or answered (not just a local answer awaiting a body)."""
        queue = self.queue
        return self.in_headers or (bool(queue) and (not queue[0].local
                                                    or not queue[0].resp_started))

    def pause_writing(self) -> None:
        self.writing_paused()
        if self.queue:
            up = self.queue[0].up
            if up is not None:
                up.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.queue:
            up = self.queue[0].up
            if up is not None:
                up.resume_reading()

    # -- flow control -----------------------------------------------------------------------
    def pause(self, reason: int) -> None:
        if not self.paused and self.transport is not None and not self.gone:
            self.transport.pause_reading()
        self.paused |= reason

    def resume(self, reason: int) -> None:
        if not self.paused & reason:
            return
        self.paused &= ~reason
        if not self.paused and self.transport is not None and not self.gone:
            self.transport.resume_reading()
            if self.reading is not None:
                self.body_at = now = self.loop.time()  # the body timeout counts from here again
                self.arm(now + self.body_timeout)

    def write(self, data: bytes) -> None:
        if self.wbuf is not None:
            self.wbuf.append(data)
        elif not self.gone:
            assert self.transport is not None
            self.transport.write(data)

    def flush(self) -> None:
        """Send what was written while corked, in one write."""
        buf = self.wbuf
        if buf is None:
            return
        self.wbuf = None
        if buf and not self.gone and self.transport is not None:
            self.transport.write(buf[0] if len(buf) == 1 else b"".join(buf))

    def reset(self) -> None:
        self.wbuf = None
        self.last_read = True
        super().reset()

    # -- the request read (``Reader``'s callbacks) -------------------------------------------
    def _version(self, method: bytes, rd: Reader) -> str:
        """The request's HTTP version, as ``get_http_version`` gives it. That formats a string
        (2k instructions, more than all the rest of the head's handling); an HTTP/1.1 request
        that began the read is recognized by its request line instead."""
        if self.first_in_read and self.rdata.startswith(
                b"%s %s HTTP/1.1\r\n" % (method, rd.url)):
            return "1.1"
        return rd.parser.get_http_version()

    def _prepare(self, ex: H1Exchange, method: bytes, rd: Reader) -> None:
        """Translate the request line and fields into a ``RequestHead`` (what only HTTP/1.1
        frames: its target forms, Transfer-Encoding) and hand it to admission, or answer it
        here when its framing cannot be forwarded."""
        ctx = self.ctx
        url = rd.url
        if method == b"CONNECT":
            ex.close = True  # answered without a tunnel, the connection closes after
            ex.admit_connect(ctx, url)
            return
        te = rd.te
        if te is not None:
            if te.strip().lower() != b"chunked":
                # llhttp framed it (chunked last) or will reject it; either way we cannot
                # forward a coding we do not know the end of (RFC 9112 §6.1).
                ex.close = True
                ex.answer_local(501, b"transfer coding not implemented\n")
                return
            if ex.version == HTTP10:
                # RFC 9112 §6.1: Transfer-Encoding in HTTP/1.0 means faulty framing: answer this
                # one, then close.
                ex.close = True
            has_body = True
        else:
            length = rd.length
            has_body = length is not None and length.strip().lstrip(b"0") != b""
        authority: bytes | None = None
        if url[:1] != b"/" and url != b"*":
            absolute = absolute_form(url)
            if absolute is None:
                ex.close = True
                ex.malformed()
                ex.answer_local(400, b"bad request target\n")
                return
            # RFC 9112 §3.2.2: the target's authority replaces Host, for routing and upstream;
            # the upstream gets the origin form.
            authority, url = absolute
        head = RequestHead(method, authority, url, rd.fields, ex.version, has_body)
        if ex.admit(ctx, head, self.client) and ex.upgrade:
            ex.close = True  # answered without a 101, the connection cannot be reused

    # -- DownstreamPort: an exchange's decisions, in HTTP/1.1 ---------------------------------
    def _begin(self, ex: H1Exchange) -> None:
        """``ex`` reached the head of the queue: answer it, open its tunnel, or send it."""
        reply = ex.reply
        if reply is not None:
            if not ex.close and ex.keep_alive and self.response_drains(ex):
                # a local answer drains its connection like any other response
                ex.close = True
                reply = reply.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1)
            self.write(reply)
            ex.response_begun()
            if ex.req_done or ex.close:
                ex.finish()
            else:
                # Finish when the rest of the request (its body, dropped) has been read, so the
                # connection stays in sync for the next one; a client that stops sending it is
                # idle, and the idle timeout closes it.
                self.idle_since = now = self.loop.time()
                self.arm(now + self.ctx.idle_timeout)
            return
        if ex.connect is not None:
            host, port = ex.connect
            open_destination(self.loop, host, port, self.ctx.connect_timeout).add_done_callback(
                lambda fut: self._destination(ex, fut))
            return
        ex.start()

    def _destination(self, ex: H1Exchange,
                     fut: asyncio.Future[tuple[asyncio.Transport, Pending]]) -> None:
        """A CONNECT's destination answered (or not): 200 and the tunnel, or a 503."""
        wanted = not (ex.resp_done or self.gone or self.closing)
        got = destination(fut, wanted)
        if not wanted:
            return
        if got is None:
            body = b"connect error\n"
            ex.tunnel_refused(503, body)
            self.write(simple_response(503, body, close=True))
            ex.finish()
            return
        t, pending = got
        ex.tunnel_opened(200)
        # RFC 9110 §9.3.6: a 2xx to CONNECT has no body, no framing; never Connection: close
        self.start_tunnel(ex, b"HTTP/1.1 200 Connection Established\r\n\r\n", t,
                          pending.buf, TunnelKind.OPAQUE, False, None)
        if pending.eof and self.relay is not None:
            self.relay.eof(Flow.TO_CLIENT)  # the destination half-closed before the relay began

    def answer(self, ex: Exchange, status: int, body: bytes,
               extra: tuple[tuple[bytes, bytes], ...]) -> None:
        # Sent when its turn comes, and the connection closed after it: for a client that
        # asked to close (``Connection: close``, HTTP/1.0 without keep-alive; RFC 9112 §9.6);
        # one that sent "Expect: 100-continue" will not send the body it held back (RFC 9110
        # §10.1.1); a malformed request; an Upgrade answered without a 101.
        h = cast(H1Exchange, ex)
        if ex.expect or ex.upgrade or ex.flags & DPE or not h.keep_alive:
            h.close = True
        h.reply = simple_response(status, body, close=h.close, head_only=h.is_head, extra=extra)

    def going_away(self, ex: Exchange) -> None:
        h = cast(H1Exchange, ex)
        h.close = True
        ex.answer_here(503, len(GOING_AWAY_BODY))
        h.reply = GOING_AWAY if not ex.is_head else GOING_AWAY_HEAD

    def hold_request(self, ex: Exchange) -> None:
        self.pause(PAUSE_BODY)

    def resume_request(self, ex: Exchange) -> None:
        self.resume(PAUSE_BODY)

    def release_request(self, ex: Exchange, credit: int) -> None:
        pass  # TCP's own window: what is not read is not acknowledged

    def send_informational(self, ex: Exchange, status: int, fields: Fields) -> None:
        if ex.version != HTTP10:
            self.write(status_line(status) + b"".join([b"%s: %s\r\n" % f for f in fields])
                       + b"\r\n")

    def send_head(self, ex: Exchange, status: int, fields: Fields,
                  length: int | None) -> None:
        h = cast(H1Exchange, ex)
        bodyless = ex.is_head or status == 204 or status == 304
        close = h.close or not h.keep_alive or self.response_drains(ex)
        v10 = ex.version == HTTP10
        out = [status_line(status)]
        svc = ex.svc_ms
        if svc >= 0:  # ours in place of the upstream's (Envoy's router overwrites it)
            for name, value in fields:
                if len(name) != 29 or name.lower() != SERVICE_TIME:
                    out.append(b"%s: %s\r\n" % (name, value))
            out.append(b"x-envoy-upstream-service-time: %d\r\n" % svc)
        else:
            for name, value in fields:
                out.append(b"%s: %s\r\n" % (name, value))
        if not bodyless and length is None:
            if v10:
                close = True  # close-delimited for an HTTP/1.0 client
            else:
                h.resp_chunked = True
                out.append(b"transfer-encoding: chunked\r\n")
        if close:
            out.append(b"connection: close\r\n")
            h.close = True
        elif v10:
            out.append(b"connection: keep-alive\r\n")
        if ex.set_cookie is not None:
            out.append(b"set-cookie: %s\r\n" % ex.set_cookie)
        if self.alt_svc is not None:
            out.append(b"alt-svc: %s\r\n" % self.alt_svc_value())
        out.append(b"\r\n")
        self.write(b"".join(out))

    def send_whole(self, ex: Exchange, status: int, data: bytes, end: int,
                   fields: Fields | None) -> bool:
        """The fast path: head and body as they came, in one write."""
        h = cast(H1Exchange, ex)
        if ex.is_head or ex.version == HTTP10 or h.close or not h.keep_alive:
            return False
        # Lines added before the head's blank line (``end``: where it starts); the upstream
        # sent no x-envoy-upstream-service-time of its own (``whole_response`` passes none).
        svc = ex.svc_ms
        added = service_time_line(svc) if svc >= 0 else b""
        if self.alt_svc is not None:  # the listener serves HTTP/3 too
            added += b"\r\nalt-svc: " + self.alt_svc_value()
        if self.response_drains(ex):
            h.close = True
            added += b"\r\nconnection: close"
        if added:
            self.write(b"".join((data[:end], added, data[end:])))
        else:
            self.write(data)
        return True

    def send_upgrade(self, ex: Exchange, fields: Fields, upgrade: bytes,
                     rest: bytes) -> bool:
        """Relay the 101, then the tunnel."""
        up = ex.up
        ut = up.take_over() if up is not None else None
        if ut is None:
            return False
        ex.switched_protocols()
        head = (b"HTTP/1.1 101 Switching Protocols\r\n"
                + b"".join([b"%s: %s\r\n" % f for f in fields])
                + b"connection: upgrade\r\nupgrade: %s\r\n\r\n" % upgrade)
        deflate = any(n.lower() == b"sec-websocket-extensions"
                      and b"permessage-deflate" in v.lower() for n, v in fields)
        self.start_tunnel(cast(H1Exchange, ex), head, ut, rest, TunnelKind.WEBSOCKET, deflate,
                          up)
        return True

    def send_body(self, ex: Exchange, data: bytes) -> None:
        self.write(chunk(data) if cast(H1Exchange, ex).resp_chunked else data)

    def send_end(self, ex: Exchange, trailers: list[tuple[bytes, bytes]] | None) -> None:
        if cast(H1Exchange, ex).resp_chunked:
            # Trailers only to a client that said it takes them (RFC 9110 §6.5.1).
            self.write(trailer_block(trailers) if trailers and ex.te_trailers else LAST_CHUNK)

    def send_local(self, ex: Exchange, status: int, body: bytes,
                   extra: tuple[tuple[bytes, bytes], ...]) -> None:
        h = cast(H1Exchange, ex)
        close = h.close or not h.keep_alive or not ex.req_done or self.response_drains(ex)
        h.close = close
        self.write(simple_response(status, body, close=close, head_only=ex.is_head, extra=extra))

    def abort(self, ex: Exchange) -> None:
        self.abort_with_active_request()

    def cork(self) -> None:
        self.wbuf = []

    def uncork(self) -> None:
        self.flush()

    # -- response side ----------------------------------------------------------------------
    def exchange_done(self, ex: Exchange) -> None:
        """The response of the head exchange is complete."""
        if self.gone:
            return
        queue = self.queue
        if not queue or queue[0] is not ex:
            return
        head = queue.pop(0)
        head.settle(True)
        if head.close or not head.req_done:
            # Closing (or the response finished before the request body, so the stream cannot
            # be resynced): requests pipelined behind are dropped unanswered, as HTTP/1.1
            # allows (RFC 9112 §9.3.2), and off the books at once.
            self._drop_queue()
            self.staged_close()
            return
        if queue:
            self._begin(queue[0])
            if len(queue) == 1:
                self.resume(PAUSE_PIPELINE)
            return
        if self.paused:
            self.resume(PAUSE_PIPELINE)
        rd = self.rd
        if (rd is not None and not self.in_headers and len(self.rdata) == 0 and not self.closing
                and not self.last_read):
            # (``_give_reader``, inline: once per request) Not inside its parser (see
            # data_received), nor with a request begun behind.
            self.rd = None
            rd.conn = None
            pool = READERS
            if pool.count < READERS_KEPT:
                rd.next = pool.top
                pool.top = rd
                pool.count += 1
        self.on_idle(self.loop.time())

    def _drop_queue(self) -> None:
        """Forget the requests still queued (never started): the connection is closing."""
        self.reading = None
        queue = self.queue
        while queue:
            ex = queue.pop(0)
            ex.settled_here()
            ex.detach()
            ex.settle(True)

    # -- errors and cuts ----------------------------------------------------------------------
    def protocol_error(self, status: int, body: bytes) -> None:
        """Malformed input: answer in order if we can, then close."""
        if self.closing or self.last_read:
            return  # nothing after the last answered request is read: no answer owed
        st = self.ctx.stats
        st.downstream_cx_protocol_error += 1
        ex = self.reading
        self.reading = None
        self.in_headers = False
        self.last_read = True
        self.pause(PAUSE_CLOSING)
        if ex is not None:
            ex.malformed()
            self._broken_body(ex, status, body)
            return
        resp = simple_response(status, body, close=True)
        st.downstream_rq_total += 1
        ex = H1Exchange(self, b"")
        now = self.loop.time()
        ex.refuse_malformed(status, len(body), self.req_started or now)
        if not self.queue:
            self.write(resp)
            ex.log_unbooked(now)  # no exchange was on the books: its line is written here
            self.staged_close()
            return
        # Behind requests still being answered: answer it when its turn comes.
        ex.keep_alive = False
        ex.reply = resp
        ex.close = True
        st.downstream_rq_active += 1
        self.queue.append(ex)

    def _broken_body(self, ex: H1Exchange, status: int, body: bytes) -> None:
        """The body of the request being received is malformed (bad chunk framing): the
        request can never complete. Answer it with the error if nothing was sent yet."""
        ex.close = True
        if ex.local:
            # already answered (or to be answered) from here: that answer stands
            ex.request_cut_short()
            if ex.resp_started:
                ex.finish()
            return
        if self.queue and self.queue[0] is not ex:
            # queued behind others: it never reaches the upstream
            ex.request_cut_short()
            ex.answer_local(status, body)
            return
        if ex.resp_started:
            self.abort_with_active_request()
            return
        ex.detach()
        ex.local_error(status, body)

    def abort_with_active_request(self) -> None:
        """An upstream failed after this response started: the client can only see a reset."""
        self.ctx.stats.downstream_cx_destroy_local_active_rq += 1
        self.reset()

    # -- tunnel (after a 101) -------------------------------------------------------------------
    def start_tunnel(self, ex: H1Exchange, head: bytes, ut: asyncio.Transport, rest: bytes,
                     kind: TunnelKind, deflate: bool, up: UpstreamConn | None) -> None:
        """Send the 101 (or CONNECT's 200) and relay both sockets from now on; ``up`` is the
        upstream connection that switched protocols and gave its socket up (None for a
        CONNECT destination)."""
        t = self.transport
        assert t is not None
        self.upgrading = None
        self.write(head)
        self.flush()  # the 101 goes out before any relayed byte
        st = self.ctx.stats
        st.downstream_cx_upgrades_total += 1
        st.downstream_cx_upgrades_active += 1
        early, ex.early = ex.early, b""
        self.paused = 0
        relay = Relay(self.loop, t, ut, kind, self.ctx.drain.grace,
                      lambda cut: self._tunnel_ended(ex, up, cut), rsv1_allowed=deflate)
        self.relay = relay
        self.start_relay(relay, early, rest)

    def _tunnel_ended(self, ex: H1Exchange, up: UpstreamConn | None, cut: bool) -> None:
        """Both sockets of the tunnel are closed: settle the books of both connections."""
        relay = self.relay
        self.relay = None
        self.ctx.stats.downstream_cx_upgrades_active -= 1
        ex.detach()
        if up is not None:
            up.tunnel_closed()  # the pool's and the cluster's bookkeeping
        ex.tunnel_closed(cut, relay.rx if relay else 0, relay.tx if relay else 0)
        ex.settled_here()
        if self.queue and self.queue[0] is ex:
            self.queue.pop(0)
            ex.settle(not cut)
        self.connection_lost(None)

    def head_unread(self) -> bool:
        return self.in_headers

    def cut(self) -> None:
        """The shutdown deadline (``Exchange.deadline_cut`` decides): the first request's 503,
        or a reset; those pipelined behind it are dropped unanswered. A head partly read is
        cut too (``head_cut``): answered 503 going away if it is first, else dropped."""
        if self.relay is not None:
            self.relay.drain_by(DrainedBy.END)  # reset both sides; counted when they are gone
            return
        queue = self.queue
        head = self.in_headers
        if head:
            self.in_headers = False
            self.last_read = True  # the rest of that head is not read as a request
            self.head_cut()
        send = queue[0].deadline_cut() if queue and queue[0].admitted else CUT_DROPPED
        for ex in queue[1:]:
            if ex.admitted:
                ex.deadline_cut(answerable=False)
        if send == CUT_ANSWER:
            first = queue[0]
            first.close = True
            self.write(GOING_AWAY_HEAD if first.is_head else GOING_AWAY)
            first.response_begun()
            first.finish()  # settled; the requests behind it dropped, the close staged
        elif send != CUT_DROPPED:
            self.reset()  # (a gRPC call too: gRPC is HTTP/2's, no status can end it here)
            return
        elif head and not queue:
            self.write(GOING_AWAY)  # RFC 9110 §15.6.4; a server may answer before a head ends
        self.staged_close()

    # -- the drain manager's questions --------------------------------------------------------
    def drain_notice(self) -> None:
        """Nothing to send: the next response carries ``Connection: close``."""

    def final_notice(self) -> None:
        """Nothing to send outside a response; a request that still comes is answered going
        away with ``Connection: close``."""

    def drain_tunnels(self, by: DrainedBy) -> None:
        if self.relay is not None:
            self.relay.drain_by(by)  # the tunnel ends now (as in Envoy)

    def on_staged_close(self, t: asyncio.Transport) -> None:
        self.last_read = True  # what the parser still holds of this read is not a request
        if self.paused:
            self.paused = 0
            t.resume_reading()

    def close_at_end(self) -> None:
        """The drain is over: an idle connection is closed now."""
        if self.relay is not None:
            self.relay.drain_by(DrainedBy.END)
            return
        if self.drain.drain_at_end(self.loop.time()):
            self.ctx.drain_stats.cx_closed_at_end += 1
        self.staged_close()

    def timeouts(self, now: float) -> float:
        ctx = self.ctx
        if self.in_headers:
            at = self.req_started + ctx.request_headers_timeout
            if now >= at:
                self.stats.downstream_rq_header_timeout += 1
                self.protocol_error(408, b"request header timeout\n")
                return STOP
            return at
        if not self.busy():
            return self.idle_timeouts(now)
        ex = self.reading
        if ex is not None and not self.paused:
            # the client's part: paused by us (the upstream is slow), the wait is not its
            at = self.body_at + self.body_timeout
            if now >= at:
                self._body_timeout(ex)
                return STOP
            return at
        return math.inf

    def _body_timeout(self, ex: H1Exchange) -> None:
        """request_body_timeout (``Exchange.body_timed_out`` decides): a 408 that closes the
        connection, or a reset; nothing after it is read."""
        self.reading = None
        self.last_read = True
        self.pause(PAUSE_CLOSING)
        if ex.body_timed_out():
            self.abort_with_active_request()
