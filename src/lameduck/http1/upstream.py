"""HTTP/1.1 upstream connection: one exchange at a time, kept alive in the endpoint's pool.

The protocol parses responses with httptools and hands them to the exchange it carries; it
owns the route timeout (from the request's end to the response's, as Envoy's route
``timeout``) and the ``per_try_idle_timeout`` (no upstream byte for that long) with one lazily
re-armed timer, so a steady keep-alive load does not allocate a timer per request.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import httptools

from lameduck.http1.wire import LAST_CHUNK, chunk, response_fields, status_code, whole_response
from lameduck.proxy.fields import HOP_BY_HOP, drop_nominated_fields, trailer_block, trailer_fields
from lameduck.proxy.message import HTTP2, HTTP11, RequestHead
from lameduck.upstream.connector import (
    ExchangeSink,
    Fields,
    ResponseTimeouts,
    UpstreamConn,
    UpstreamError,
)

if TYPE_CHECKING:
    from lameduck.upstream.pool import Endpoint


def request_head(head: RequestHead) -> bytes:
    """``head`` as HTTP/1.1 text, formatted once."""
    # RFC 9112 §3.2: Host first, on every request (empty where no authority was named);
    # then how this hop frames the message, then the fields as admission prepared them.
    out = [head.method, b" ", head.path, b" HTTP/1.1\r\nhost: ", head.authority or b"",
           b"\r\n"]
    if head.te_trailers:
        # The client takes trailers, and so does lameduck on its behalf (RFC 9110 §10.1.4;
        # TE is this hop's own field, so Connection names it).
        out.append(b"te: trailers\r\nconnection: te\r\n")
    if head.websocket:
        # RFC 6455 §4.1: relayed as asked; a 101 turns the connection into a tunnel. An
        # RFC 8441 stream (HTTP/2) has no key of its own: one is made for this hop.
        out.append(b"connection: upgrade\r\nupgrade: websocket\r\n")
        if head.protocol is not None:
            out.append(b"sec-websocket-key: %s\r\n" % base64.b64encode(os.urandom(16)))
    elif head.chunked:
        out.append(b"transfer-encoding: chunked\r\n")
    fields = head.fields
    client = head.client
    # The connection's own X-Forwarded-For and -Proto end the fields: formatted once for it.
    n = len(fields) - 2 if client is not None else len(fields)
    for i in range(n):  # one join of every piece: no bytes made per field
        name, value = fields[i]
        out.append(name)
        out.append(b": ")
        out.append(value)
        out.append(b"\r\n")
    if client is not None:  # the pair and the head's end
        end = client.formatted
        if not end:
            end = client.formatted = b"%s: %s\r\n%s: %s\r\n\r\n" % (
                *client.for_field, *client.proto_field)
        out.append(end)
    else:
        out.append(b"\r\n")
    return b"".join(out)


class H1Upstream(UpstreamConn):
    """One keep-alive connection to one endpoint."""

    def __init__(self, endpoint: Endpoint, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(multiplexed=False)
        self.endpoint = endpoint
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.keep_alive = True
        self.closed_here = False  # we closed it (else the upstream did, or the network)
        self.requests = 0
        self.on_opened: Callable[[H1Upstream], None] | None = None  # run at connection_made
        self.on_closed: list = []  # callbacks(conn) run once when the connection is lost
        # response state
        self.fields: list[tuple[bytes, bytes]] = []  # response fields to forward
        self.length: int | None = None
        self.chunked = False
        self.nominated = b""  # field names listed in Connection
        self.in_trailers = False  # the head is parsed: fields now are the trailer section
        self.trailers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.head_seen = False
        self.fresh = False
        self.no_body = False  # HEAD request: llhttp cannot be told, so we end it ourselves
        self.chunked_req = False  # the request body is sent in chunks (framed by ``write``)
        self.close_delimited = False
        self.switching = False  # a 101 Switching Protocols head was parsed
        self.upgrade = b""  # its Upgrade field
        # The last response ``whole_response`` passed, kept to skip its scan when the next one
        # repeats it: its verdict depends only on the head's bytes and the total size, and a
        # keep-alive origin often sends the same head (and length) again. ``whole_out``: the
        # head as forwarded, without its Connection and Keep-Alive lines (b"" when it had
        # none: forwarded as it came); ``whole_end``: where that head's blank line starts.
        self.whole_head = b""
        self.whole_size = -1
        self.whole_end = 0
        self.whole_out = b""
        # ``whole_head``'s fields as forwarded, read once for the sinks that want them (an
        # HTTP/2 client's HEADERS, the access log's %RESP()%); None until one does.
        self.whole_fields: Fields | None = None
        self.want_fields = False  # this response's sink wants them
        # timeouts: one lazily re-armed timer for both
        self.timeouts = ResponseTimeouts()  # the route and per-try idle timeouts
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0

    # -- pool interface ---------------------------------------------------------------------
    @property
    def reusable(self) -> bool:
        return self.alive and self.keep_alive and self.sink is None

    def close(self) -> None:
        self.alive = False
        self.closed_here = True
        if self.transport is not None:
            self.transport.close()

    def take_over(self) -> asyncio.Transport | None:
        if self.transport is None:
            return None
        self.sink = None
        self.alive = False  # never back to the pool
        return self.transport

    def tunnel_closed(self) -> None:
        self.connection_lost(None)

    def sever(self) -> None:
        """Cut by its endpoint's drain stop: the exchange on it fails (a close-delimited body
        too: the FIN that follows is ours, not the end of the body)."""
        self.close_delimited = False
        self.close()

    def abort(self) -> None:
        self.alive = False
        self.closed_here = True
        self.sink = None
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if not self.read_paused and self.alive and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Also run when the exchange lets go: a pooled connection must be read (to see its
        upstream close it) and the next exchange starts unpaused."""
        if self.read_paused:
            self.read_paused = False
            if self.alive and self.transport is not None:
                self.transport.resume_reading()

    # -- sending ----------------------------------------------------------------------------
    def start(self, sink: ExchangeSink, head: RequestHead) -> None:
        """Send a request head, formatted here once; a body of unknown length written after
        it is framed in chunks here."""
        self.sink = sink
        self.chunked_req = head.chunked
        self.requests += 1
        # No byte of this response read yet (the parser is at a boundary): a whole response
        # may go as it came to an HTTP/1.1 client, or as HEADERS and one DATA frame to an
        # HTTP/2 one (from its fields, read here once per distinct head); an HTTP/1.0 client's
        # is reframed, so for it the fast path's scan is not spent.
        version = head.version
        self.fresh = version in (HTTP11, HTTP2)
        self.want_fields = version == HTTP2 or sink.wants_fields
        self.head_seen = False
        self.got_bytes = False
        self.no_body = head.method == b"HEAD"
        self.close_delimited = False
        self.timeouts = ResponseTimeouts()  # no timer runs for it until ``end``
        assert self.transport is not None
        self.transport.write(request_head(head))

    def write(self, data: bytes) -> None:
        """Request body bytes, as the client sent them (unframed)."""
        if self.transport is not None and self.alive and data:
            self.transport.write(chunk(data) if self.chunked_req else data)

    def end(self, trailers: list[tuple[bytes, bytes]] | None, timeout: float,
            idle_timeout: float) -> None:
        """The request body is complete; a chunked one carries ``trailers`` (a sized body has
        nowhere to put them, RFC 9112 §7.1.2). The timeouts run from here: an upload as long
        as it takes is not cut by the route timeout (Envoy's starts at the request's end)."""
        if self.chunked_req and self.transport is not None and self.alive:
            self.chunked_req = False
            self.transport.write(trailer_block(trailers) if trailers else LAST_CHUNK)
        if self.sink is None or (timeout <= 0 and idle_timeout <= 0):
            return
        at = self.timeouts.start(self.loop.time(), timeout, idle_timeout)
        if at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self.timer is not None:
            if self.timer_at <= at:
                return
            self.timer.cancel()
        self.timer_at = at
        self.timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if self.sink is None:
            return
        at = self.timeouts.expire(self.loop.time(), self.sink, self.head_seen, self.abort)
        if at:
            self._arm(at)

    # -- asyncio ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.on_opened is not None:
            self.on_opened(self)

    def data_received(self, data: bytes) -> None:
        sink = self.sink
        if sink is None:  # bytes with no request outstanding: not HTTP we can trust
            self.abort()
            return
        self.got_bytes = True
        if self.timeouts.idle:  # no clock read per read without an idle timeout
            self.timeouts.touch(self.loop.time())
        if self.fresh:
            self.fresh = False
            out = data  # what is forwarded: the response less its Connection / Keep-Alive
            fields: Fields | None = None
            if len(data) == self.whole_size and data.startswith(self.whole_head):
                end = self.whole_end  # the head of the last whole response, byte for byte
                fields = self.whole_fields
                if self.whole_out:
                    out = self.whole_out + data[len(self.whole_head):]
            else:
                end, cut, cut_to, cut2, cut2_to = whole_response(data)
                if end:
                    self.whole_head = data[:end + 4]
                    self.whole_size = len(data)
                    self.whole_out = b""
                    self.whole_fields = None
                    if cut:  # the lines the parser's path would not forward either
                        if cut2:
                            out = b"".join((data[:cut], data[cut_to:cut2], data[cut2_to:]))
                        else:
                            out = data[:cut] + data[cut_to:]
                        end -= cut_to - cut + cut2_to - cut2
                        self.whole_out = out[:end + 4]
                    self.whole_end = end
            if end and self.want_fields and fields is None:
                self.whole_fields = fields = response_fields(out[:end])
            if end and sink.on_whole_response(status_code(data), out, end, fields):
                return  # forwarded in one piece; the exchange is complete and let go of us
        # What one read produces downstream (head, body, end) leaves in one write: one
        # syscall instead of three for a small response.
        sink.cork()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            # A 101: relayed only when the request asked for that upgrade (the sink takes the
            # socket over); otherwise not relayable.
            offset = e.args[0] if e.args else len(data)
            if not (self.switching and sink.on_upgrade(self.fields, self.upgrade, data[offset:])):
                self._fail(UpstreamError.RESET)
        except httptools.HttpParserError:
            self._fail(UpstreamError.RESET)
        finally:
            sink.uncork()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        sink = self.sink
        if sink is not None:
            self.sink = None
            if self.head_seen and self.close_delimited and exc is None:
                sink.on_response_complete()  # a FIN ends a close-delimited body; a reset does not
            else:
                sink.on_upstream_error(UpstreamError.RESET, self.head_seen)
        for cb in self.on_closed:
            cb(self)
        self.on_closed = []

    def pause_writing(self) -> None:
        if self.sink is not None:
            self.sink.pause_request_body()

    def resume_writing(self) -> None:
        if self.sink is not None:
            self.sink.resume_request_body()

    def _fail(self, status: int) -> None:
        sink = self.sink
        head_seen = self.head_seen
        self.abort()
        if sink is not None:
            sink.on_upstream_error(status, head_seen)

    # -- httptools callbacks ----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.in_trailers = False
        if self.trailers:  # almost no response has any: no new list each time
            self.trailers = []
        self.fields = []
        self.length = None
        self.chunked = False
        self.nominated = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_trailers:  # after a chunked body: the trailer section
            self.trailers.append((name, value))
            return
        # Classified as they arrive: the fields to forward, and what frames the body.
        n = name.lower()
        if n in HOP_BY_HOP:
            if n == b"transfer-encoding":
                self.chunked = value.lower().rstrip().endswith(b"chunked")
                if value.strip().lower() != b"chunked":
                    # gzip, chunked: we re-frame chunks but do not forward the other coding,
                    # so the body would reach the client corrupted; refuse it (502) instead
                    raise ValueError("transfer coding other than chunked")
            elif n == b"connection":
                self.nominated += b"," + value.lower()
            elif n == b"upgrade":
                self.upgrade = value
            return
        if n == b"content-length":
            self.length = int(value)
        self.fields.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_trailers = True
        if self.parser.get_http_version()[0] != "1":
            # llhttp parses "HTTP/2.0 200" too; on an HTTP/1.1 connection it is no HTTP/1.1
            # message (RFC 9112 §2.3): refused as any malformed head (502)
            raise ValueError("not an HTTP/1.x response")
        status = self.parser.get_status_code()
        sink = self.sink
        if sink is None:
            return
        if status < 200:
            if status == 101:
                self.switching = True  # llhttp stops here: see HttpParserUpgrade
            else:
                sink.on_informational(status, self.fields)
            return
        self.status = status
        self.head_seen = True
        fields = self.fields
        if self.nominated:
            fields = drop_nominated_fields(fields, self.nominated)
        length = self.length
        chunked = self.chunked
        bodyless = self.no_body or status in (204, 304)
        self.close_delimited = not bodyless and length is None and not chunked
        if not self.parser.should_keep_alive() or self.close_delimited:
            self.keep_alive = False
        sink.on_response_head(status, fields, length, chunked)
        if self.no_body and self.sink is sink:
            # llhttp would wait for a HEAD response's Content-Length bytes; end it here and
            # give the next response a fresh parser.
            self.parser = httptools.HttpResponseParser(self)
            self._complete()

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink.on_response_body(body)

    def on_message_complete(self) -> None:
        if self.head_seen and self.sink is not None and not self.no_body:
            self._complete()

    def _complete(self) -> None:
        sink = self.sink
        self.sink = None
        self.head_seen = False
        if sink is not None:
            sink.on_response_complete(trailer_fields(self.trailers) if self.trailers else None)
