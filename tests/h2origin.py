"""An h2c origin (cleartext HTTP/2, prior knowledge) on the ``h2`` library, for the HTTP/2
upstream tests: a real peer that is not lameduck's own HTTP/2 code, and that misbehaves on
request so draining and error handling can be checked over real sockets.

Run as ``python tests/h2origin.py --port 0 [--max-streams N] [--window W]``; it prints
``listening on 127.0.0.1:PORT`` once bound.

Flags:
  --port P          port to bind on 127.0.0.1 (0: any free port; the line above tells which)
  --max-streams N   SETTINGS_MAX_CONCURRENT_STREAMS it advertises (default 100). A stream opened
                    beyond it is refused with RST_STREAM(REFUSED_STREAM) (a ``refused`` line).
  --window W        SETTINGS_INITIAL_WINDOW_SIZE it advertises (default 65535), the receive
                    window of each stream; above 65535 the connection window is raised to match
                    with a WINDOW_UPDATE.

Behaviour by request path (the query string is ignored; HEAD gets the head of what GET gets):
  /                 200 text/plain ``hello from h2 origin\\n`` with content-length (so does any
                    path not listed here)
  /echo             200, the request body streamed back as it arrives (no content-length).
                    Flow control both ways: it sends only within the peer's window, and it
                    acknowledges received DATA (WINDOW_UPDATE) only as that data is echoed, so a
                    reader that stops reading stalls the writer.
  /bytes/N          200, N bytes of ``bytes(i % 251 for i in range(N))``, content-length N, sent
                    in frames within the peer's flow-control window.
  /slow/MS          waits MS milliseconds, then 200 ``slow\\n``.
  /status/CODE      that status (200..599) with a short body (none for 204 and 304).
  /headers          200 application/json: ``[[name, value], ...]``, the request's header fields
                    as received, pseudo-headers first, in wire order.
  /trailers         200 with ``trailer: x-checksum``, a body, then trailers
                    ``x-checksum: <sha256 hex of the body>``.
  /interim          103 Early Hints (``link: </a>; rel=preload``), then 200 ``interim done\\n``.
  /reset            RST_STREAM(INTERNAL_ERROR), no response.
  /reset-after-head 200 head (content-length 100000) and 1000 bytes of body, then ~50 ms later
                    RST_STREAM(INTERNAL_ERROR).
  /refuse           RST_STREAM(REFUSED_STREAM), no response (RFC 9113 §8.7: safe to retry).
  /refuse-once/KEY  the first request with KEY is refused like /refuse (with ``?after=N``, once
                    N body bytes have come); later ones read the whole body and answer 200
                    "<size> <sha256 hex>" of it.
  /goaway           GOAWAY(last_stream_id = this stream's id - 2, NO_ERROR) and no answer to
                    this stream: it and every later stream on the connection are unprocessed
                    (later ones get an ``ignored`` line and no answer). Streams at or below the
                    last id are finished, then the connection is closed.
  /drain            200 ``draining\\n``, then a graceful drain of every connection open in the
                    process: GOAWAY(2^31-1, NO_ERROR), ~200 ms later GOAWAY(highest stream id
                    received, NO_ERROR), in-flight streams finished, each connection closed once
                    its streams are done. Connections accepted afterwards are served normally.
  /close            the TCP connection is aborted (transport.abort()) without an answer.
  /malformed        200 head carrying the connection-specific field ``connection: close``
                    (invalid in HTTP/2, RFC 9113 §8.2.2) and a short body.

SIGTERM: stop listening, the same graceful drain as /drain, exit once every connection has
closed (at most 5 s; then the rest are aborted).

A GOAWAY from the client does not stop the server (the ``h2`` library alone would refuse to send
anything after one, python-hyper/h2#1181): it is logged, streams in flight are finished, and the
connection is closed once they are done.

Stdout, one line per event, flushed at once (N counts connections from 1, S is a stream id):
  listening on 127.0.0.1:PORT
  open conn=N
  request conn=N stream=S method=M path=P      a request that is being processed
  ignored conn=N stream=S method=M path=P      a stream above the GOAWAY last id we sent
  refused conn=N stream=S method=M path=P      over --max-streams: RST_STREAM(REFUSED_STREAM)
  goaway-sent conn=N last=L code=C
  goaway-received conn=N last=L code=C
  protocol-error conn=N <message>             the client broke HTTP/2; GOAWAY sent, closed
  drain reason=path|sigterm conns=K
  closed conn=N streams=M                      M: request streams the client opened on it
  exit
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import signal
import struct
import sys
from dataclasses import dataclass, field

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RemoteSettingsChanged,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError, StreamClosedError
from h2.settings import SettingCodes, Settings

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_ID = 2**31 - 1
GOAWAY_TYPE = 0x7
DRAIN_PHASE_GAP = 0.2  # seconds between the two GOAWAYs of a graceful drain
LINGER = 1.0  # seconds to wait for the client's close after our FIN
EXIT_BOUND = 5.0  # SIGTERM: seconds before the remaining connections are aborted
PERIOD = bytes(range(251))


def out(line: str) -> None:
    print(line, flush=True)


def pattern(n: int) -> bytes:
    """``bytes(i % 251 for i in range(n))``, built fast."""
    return (PERIOD * (n // 251 + 1))[:n]


def goaway_frame(last: int, code: int) -> bytes:
    payload = struct.pack("!II", last & MAX_ID, code)
    return struct.pack("!I", len(payload))[1:] + bytes([GOAWAY_TYPE, 0]) + b"\0\0\0\0" + payload


def rst_frame(sid: int, code: int) -> bytes:
    return b"\0\0\x04\x03\0" + struct.pack("!II", sid & MAX_ID, code)


@dataclass
class Stream:
    sid: int
    method: str
    path: str
    headers: list[tuple[str, str]]
    echo: bool = False  # /echo: DATA is queued and acknowledged only once echoed
    body: asyncio.Queue[tuple[bytes, int] | None] = field(default_factory=asyncio.Queue)
    reset: bool = False
    task: asyncio.Task[None] | None = None


class Origin:
    """The process: its listening socket and open connections, and the drain of all of them."""

    def __init__(self, max_streams: int, window: int) -> None:
        self.max_streams = max_streams
        self.window = window
        self.conns: set[Conn] = set()
        self.refused_keys: set[str] = set()  # /refuse-once/KEY seen
        self.next_conn = 1
        self.server: asyncio.base_events.Server | None = None
        self.all_closed = asyncio.Event()
        self.all_closed.set()

    def new_conn(self) -> Conn:
        conn = Conn(self, self.next_conn)
        self.next_conn += 1
        return conn

    def added(self, conn: Conn) -> None:
        self.conns.add(conn)
        self.all_closed.clear()

    def removed(self, conn: Conn) -> None:
        self.conns.discard(conn)
        if not self.conns:
            self.all_closed.set()

    def drain(self, reason: str) -> None:
        out(f"drain reason={reason} conns={len(self.conns)}")
        for conn in list(self.conns):
            conn.begin_drain()


class Conn(asyncio.Protocol):
    """One h2c connection. GOAWAY frames are handled here, never by ``h2``, both ways: ``h2``'s
    state machine closes on any GOAWAY, while a graceful drain keeps finishing streams."""

    def __init__(self, origin: Origin, n: int) -> None:
        self.origin = origin
        self.n = n
        self.h2 = H2Connection(H2Configuration(client_side=False, header_encoding=None))
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.active: set[int] = set()  # processed streams whose answer is not finished
        self.opened = 0  # request streams the client opened
        self.inbuf = bytearray()
        self.preface_seen = False
        self.goaway_last: int | None = None  # last-stream-id of the newest GOAWAY we sent
        self.draining = False
        self.peer_goaway = False
        self.closing = False
        self.lost = False
        self.window_changed = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()

    # -- transport callbacks ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.origin.added(self)
        out(f"open conn={self.n}")
        self.h2.local_settings = Settings(client=False, initial_values={
            SettingCodes.MAX_CONCURRENT_STREAMS: self.origin.max_streams,
            SettingCodes.INITIAL_WINDOW_SIZE: self.origin.window,
        })
        self.h2.initiate_connection()
        # Advertised above; enforced here (a REFUSED_STREAM per extra stream) rather than by h2,
        # which would end the whole connection with PROTOCOL_ERROR.
        self.h2.local_settings[SettingCodes.MAX_CONCURRENT_STREAMS] = MAX_ID
        self.h2.local_settings.acknowledge()
        if self.origin.window > 65535:
            self.h2.increment_flow_control_window(self.origin.window - 65535)
        self.flush()

    def data_received(self, data: bytes) -> None:
        self.inbuf += data
        if not self.preface_seen:
            if len(self.inbuf) < len(PREFACE):
                return
            chunk = bytes(self.inbuf[:len(PREFACE)])
            del self.inbuf[:len(PREFACE)]
            self.preface_seen = True
            self.feed(chunk)
        # Pass whole frames on to h2, keeping GOAWAY frames back.
        start = pos = 0
        buf = self.inbuf
        while len(buf) - pos >= 9:
            length = int.from_bytes(buf[pos:pos + 3], "big")
            end = pos + 9 + length
            if len(buf) < end:
                break
            if buf[pos + 3] == GOAWAY_TYPE:
                if pos > start:
                    self.feed(bytes(buf[start:pos]))
                if length >= 8:
                    last, code = struct.unpack("!II", buf[pos + 9:pos + 17])
                    self.on_peer_goaway(last & MAX_ID, code)
                start = end
            pos = end
        if pos > start:
            self.feed(bytes(buf[start:pos]))
        del buf[:pos]

    def eof_received(self) -> bool:
        return False  # close our side too

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        for st in self.streams.values():
            if st.task is not None and not st.task.done():
                st.task.cancel()
        self.wake()
        self.writable.set()
        out(f"closed conn={self.n} streams={self.opened}")
        self.origin.removed(self)

    # -- h2 plumbing ----------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self.closing or self.lost:
            return
        try:
            events = self.h2.receive_data(data)
        except ProtocolError as e:
            out(f"protocol-error conn={self.n} {type(e).__name__}: {e}")
            self.flush()
            self.closing = True
            assert self.transport is not None
            self.transport.close()
            return
        for ev in events:
            self.on_event(ev)
        self.flush()

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def write_raw(self, frame: bytes) -> None:
        self.flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame)

    def wake(self) -> None:
        """Flow-control windows may have opened (or the stream or connection is gone)."""
        self.window_changed.set()
        self.window_changed = asyncio.Event()

    def on_event(self, ev: object) -> None:
        if isinstance(ev, RequestReceived):
            self.on_request(ev.stream_id, ev.headers)
        elif isinstance(ev, DataReceived):
            st = self.streams.get(ev.stream_id)
            if st is not None and st.echo and st.sid in self.active:
                st.body.put_nowait((ev.data, ev.flow_controlled_length))
            else:
                self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, StreamEnded):  # also after a HEADERS or trailers with END_STREAM
            st = self.streams.get(ev.stream_id)
            if st is not None:
                st.body.put_nowait(None)
        elif isinstance(ev, StreamReset):
            st = self.streams.get(ev.stream_id)
            if st is not None:
                st.reset = True
                while not st.body.empty():  # queued for an echo that will not happen
                    item = st.body.get_nowait()
                    if item is not None:
                        self.h2.acknowledge_received_data(item[1], ev.stream_id)
                st.body.put_nowait(None)
            self.wake()
        elif isinstance(ev, WindowUpdated | RemoteSettingsChanged):
            self.wake()
        elif isinstance(ev, ConnectionTerminated):  # not reached: GOAWAY never gets to h2
            self.on_peer_goaway(ev.last_stream_id or 0, int(ev.error_code or 0))

    def on_peer_goaway(self, last: int, code: int) -> None:
        out(f"goaway-received conn={self.n} last={last} code={code}")
        self.peer_goaway = True
        if self.transport is not None and not self.closing:
            asyncio.get_running_loop().call_soon(self.maybe_close)

    # -- requests -------------------------------------------------------------------------------
    def on_request(self, sid: int, raw: list[tuple[bytes, bytes]]) -> None:
        headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in raw]
        h = dict(headers)
        method, path = h.get(":method", ""), h.get(":path", "")
        self.opened += 1
        st = Stream(sid, method, path, headers)
        self.streams[sid] = st
        where = f"conn={self.n} stream={sid} method={method} path={path}"
        if self.goaway_last is not None and sid > self.goaway_last:
            out(f"ignored {where}")  # unprocessed: the client may retry it elsewhere
            return
        # Streams the client opened before this one that are still open (h2 has already seen
        # every HEADERS of this read, so its own count would include later streams too).
        earlier = sum(1 for i, s in self.h2.streams.items() if i % 2 and i < sid and s.open)
        if earlier >= self.origin.max_streams:
            out(f"refused {where}")
            self.h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            return
        out(f"request {where}")
        route = path.split("?", 1)[0]
        st.echo = route == "/echo" or route.startswith("/refuse-once/")  # they read the body
        self.active.add(sid)
        st.task = asyncio.get_running_loop().create_task(self.run(st))

    async def run(self, st: Stream) -> None:
        try:
            await self.handle(st)
        except (StreamClosedError, ProtocolError, ConnectionError, asyncio.CancelledError):
            pass  # the client reset the stream or the connection went away
        finally:
            self.active.discard(st.sid)
            self.streams.pop(st.sid, None)
            if not self.lost:
                self.flush()
                self.maybe_close()

    async def respond(self, st: Stream, status: int, body: bytes = b"",
                      ctype: str = "text/plain", extra: list[tuple[str, str]] | None = None,
                      length: bool = True) -> None:
        head = [(":status", str(status))]
        if body or status not in (204, 304):
            head.append(("content-type", ctype))
        if length and status not in (204, 304):
            head.append(("content-length", str(len(body))))
        head += extra or []
        no_body = st.method == "HEAD" or status in (204, 304)
        self.h2.send_headers(st.sid, head, end_stream=no_body or not body)
        self.flush()
        if not no_body and body:
            await self.send(st, body, end=True)

    async def send(self, st: Stream, data: bytes, end: bool = False) -> None:
        """DATA within the peer's flow-control windows and our socket's write buffer."""
        view = memoryview(data)
        while True:
            if self.lost or st.reset:
                raise ConnectionError("stream or connection gone")
            await self.writable.wait()
            if not view:
                if end:
                    self.h2.end_stream(st.sid)
                    self.flush()
                return
            window = self.h2.local_flow_control_window(st.sid)
            if window <= 0:
                await self.window_changed.wait()
                continue
            n = min(window, self.h2.max_outbound_frame_size, len(view))
            chunk, view = view[:n], view[n:]
            self.h2.send_data(st.sid, chunk.tobytes(), end_stream=end and not view)
            self.flush()
            if end and not view:
                return

    async def handle(self, st: Stream) -> None:
        path = st.path.split("?", 1)[0]
        parts = path.strip("/").split("/")
        loop = asyncio.get_running_loop()
        if path == "/echo":
            self.h2.send_headers(st.sid, [(":status", "200"),
                                          ("content-type", "application/octet-stream")],
                                 end_stream=st.method == "HEAD")
            self.flush()
            while (item := await st.body.get()) is not None:
                data, flow = item
                try:
                    if st.method != "HEAD":
                        await self.send(st, data)
                finally:  # acknowledged once echoed (or once it never will be)
                    if not self.lost:
                        self.h2.acknowledge_received_data(flow, st.sid)
                        self.flush()
            if st.reset:
                return
            if st.method != "HEAD":
                await self.send(st, b"", end=True)
        elif parts[0] == "bytes" and len(parts) == 2:
            n = _int(parts[1])
            if n is None or not 0 <= n <= 1 << 30:
                await self.respond(st, 400, b"bad size\n")
                return
            await self.respond(st, 200, pattern(n), ctype="application/octet-stream")
        elif parts[0] == "slow" and len(parts) == 2:
            ms = _int(parts[1])
            if ms is None or not 0 <= ms <= 600_000:
                await self.respond(st, 400, b"bad delay\n")
                return
            await asyncio.sleep(ms / 1000)
            await self.respond(st, 200, b"slow\n")
        elif parts[0] == "status" and len(parts) == 2:
            code = _int(parts[1])
            if code is None or not 200 <= code <= 599:
                await self.respond(st, 400, b"bad status\n")
                return
            body = b"" if code in (204, 304) else f"status {code}\n".encode()
            await self.respond(st, code, body)
        elif path == "/headers":
            body = json.dumps([[n, v] for n, v in st.headers]).encode() + b"\n"
            await self.respond(st, 200, body, ctype="application/json")
        elif path == "/trailers":
            body = b"".join(f"line {i} of a body with trailers\n".encode() for i in range(100))
            self.h2.send_headers(st.sid, [(":status", "200"), ("content-type", "text/plain"),
                                          ("trailer", "x-checksum")],
                                 end_stream=st.method == "HEAD")
            self.flush()
            if st.method == "HEAD":
                return
            await self.send(st, body)
            self.h2.send_headers(st.sid, [("x-checksum", hashlib.sha256(body).hexdigest())],
                                 end_stream=True)
            self.flush()
        elif path == "/interim":
            self.h2.send_headers(st.sid, [(":status", "103"), ("link", "</a>; rel=preload")])
            self.flush()
            await asyncio.sleep(0.01)
            await self.respond(st, 200, b"interim done\n")
        elif path == "/reset":
            self.h2.reset_stream(st.sid, ErrorCodes.INTERNAL_ERROR)
        elif path == "/reset-after-head":
            self.h2.send_headers(st.sid, [(":status", "200"), ("content-type", "text/plain"),
                                          ("content-length", "100000")])
            self.flush()
            await self.send(st, b"x" * 1000)
            await asyncio.sleep(0.05)
            self.h2.reset_stream(st.sid, ErrorCodes.INTERNAL_ERROR)
        elif path == "/refuse":
            self.h2.reset_stream(st.sid, ErrorCodes.REFUSED_STREAM)
        elif parts[0] == "refuse-once" and len(parts) == 2:
            if parts[1] not in self.origin.refused_keys:
                self.origin.refused_keys.add(parts[1])
                # ?after=N: refused only once N body bytes have come (a client that had sent
                # them can no longer have kept them all).
                after = int(st.path.partition("after=")[2] or 0)
                got = 0
                while got < after and (item := await st.body.get()) is not None:
                    got += len(item[0])
                    self.h2.acknowledge_received_data(item[1], st.sid)
                    self.flush()
                self.h2.reset_stream(st.sid, ErrorCodes.REFUSED_STREAM)
                self.flush()
                return
            digest, size = hashlib.sha256(), 0
            while (item := await st.body.get()) is not None:
                data, flow = item
                digest.update(data)
                size += len(data)
                if not self.lost:
                    self.h2.acknowledge_received_data(flow, st.sid)
                    self.flush()
            await self.respond(st, 200, f"{size} {digest.hexdigest()}\n".encode())
        elif path == "/goaway":
            self.send_goaway(max(st.sid - 2, 0))
        elif path == "/drain":
            await self.respond(st, 200, b"draining\n")
            loop.call_soon(self.origin.drain, "path")
        elif path == "/close":
            assert self.transport is not None
            self.transport.abort()
        elif path == "/malformed":
            # h2 would reject the field (validation) or strip it (normalization): both off.
            cfg = self.h2.config
            cfg.validate_outbound_headers = cfg.normalize_outbound_headers = False
            try:
                self.h2.send_headers(st.sid, [(":status", "200"), ("connection", "close"),
                                              ("content-type", "text/plain"),
                                              ("content-length", "10")])
            finally:
                cfg.validate_outbound_headers = cfg.normalize_outbound_headers = True
            self.flush()
            await self.send(st, b"malformed\n", end=True)
        else:
            await self.respond(st, 200, b"hello from h2 origin\n")

    # -- GOAWAY, drain and close ----------------------------------------------------------------
    def send_goaway(self, last: int, code: int = 0) -> None:
        if self.goaway_last is not None:
            last = min(last, self.goaway_last)  # a later GOAWAY may not raise the last id
        self.goaway_last = last
        self.write_raw(goaway_frame(last, code))
        out(f"goaway-sent conn={self.n} last={last} code={code}")
        asyncio.get_running_loop().call_soon(self.maybe_close)

    def begin_drain(self) -> None:
        if self.draining or self.closing or self.lost:
            return
        self.draining = True
        if self.goaway_last is None:
            self.write_raw(goaway_frame(MAX_ID, 0))
            out(f"goaway-sent conn={self.n} last={MAX_ID} code=0")
        asyncio.get_running_loop().call_later(DRAIN_PHASE_GAP, self.drain_phase_two)

    def drain_phase_two(self) -> None:
        if self.closing or self.lost:
            return
        self.send_goaway(self.h2.highest_inbound_stream_id)

    def maybe_close(self) -> None:
        """Close once a final GOAWAY went out (or one came in) and no answer is in progress."""
        if self.closing or self.lost or self.active:
            return
        assert self.transport is not None
        if self.transport.is_closing():
            return
        if self.goaway_last is None and not self.peer_goaway:
            return
        self.closing = True
        self.flush()
        if self.transport.can_write_eof():
            self.transport.write_eof()  # FIN after everything queued; read until the client closes
            asyncio.get_running_loop().call_later(LINGER, self.transport.close)
        else:
            self.transport.close()


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


async def main(port: int, max_streams: int, window: int) -> None:
    origin = Origin(max_streams, window)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(origin.new_conn, "127.0.0.1", port)
    origin.server = server
    bound = server.sockets[0].getsockname()[1]
    out(f"listening on 127.0.0.1:{bound}")
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()  # stop listening; the open connections drain
    origin.drain("sigterm")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(origin.all_closed.wait(), EXIT_BOUND)
    for conn in list(origin.conns):
        if conn.transport is not None:
            conn.transport.abort()
    await asyncio.sleep(0)
    out("exit")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--max-streams", type=int, default=100)
    ap.add_argument("--window", type=int, default=65535)
    args = ap.parse_args()
    if not 1 <= args.window <= MAX_ID:
        ap.error("--window must be in 1..2^31-1")
    if args.max_streams < 0:
        ap.error("--max-streams must be >= 0")
    try:
        asyncio.run(main(args.port, args.max_streams, args.window))
    except KeyboardInterrupt:
        sys.exit(130)
