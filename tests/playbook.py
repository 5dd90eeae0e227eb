"""Play the real proxy core with no sockets: a fake clock, a scripted upstream and a downstream
that records what the exchange decided (mitmproxy's ``tutils.Playbook`` is the model).

The ``Exchange`` under test is the one both codecs run; only the two ends are stand-ins: the
``DownstreamPort`` (what HTTP/1.1 or HTTP/2 would write) and the ``UpstreamConn`` (what a pooled
connection or an HTTP/2 stream would report). Every step is exact: time moves only when a test
moves it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from lameduck.drain import ListenerDrain, ProcessDrain
from lameduck.drain.endpoint import EndpointDrain
from lameduck.http1.upstream import H1Upstream
from lameduck.http2.connection import H2Limits
from lameduck.proxy.admission import Client
from lameduck.proxy.downstream import Downstream as ConnectionDownstream
from lameduck.proxy.exchange import Exchange
from lameduck.proxy.message import HTTP11, RequestHead
from lameduck.stats import DrainStats, Http2Stats, Http3Stats, HttpStats
from lameduck.upstream.cluster import Cluster
from lameduck.upstream.connector import Fields, UpstreamConn
from lameduck.upstream.pool import Endpoint
from lameduck.upstream.router import Route, Router


class Loop(asyncio.AbstractEventLoop):
    """``time`` and ``call_at``, by hand: ``advance`` fires what is due, in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[asyncio.TimerHandle] = []

    def time(self) -> float:
        return self.now

    def get_debug(self) -> bool:
        return False

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,
                context: Any = None) -> asyncio.TimerHandle:
        handle = asyncio.TimerHandle(when, callback, args, self)
        self.timers.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any,
                   context: Any = None) -> asyncio.TimerHandle:
        return self.call_at(self.now + delay, callback, *args)

    def call_soon(self, callback: Callable[..., object], *args: Any,
                  context: Any = None) -> asyncio.TimerHandle:
        """Due now: run by the next ``advance`` (or ``run_soon``)."""
        return self.call_at(self.now, callback, *args)

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)

    def run_soon(self) -> None:
        self.advance(self.now)

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        pass

    def advance(self, to: float, max_fires: int = 10_000) -> None:
        """Fire what is due by ``to``; a timer that keeps re-arming without moving on fails the
        test (after ``max_fires``) instead of hanging it."""
        for _ in range(max_fires + 1):
            due = sorted((h for h in self.timers if not h.cancelled() and h.when() <= to),
                         key=lambda h: h.when())
            if not due:
                break
            handle = due[0]
            self.timers.remove(handle)
            self.now = max(self.now, handle.when())
            handle._run()
        else:
            raise AssertionError(f"more than {max_fires} timers due by {to}: one never moves on")
        self.now = to


class Transport(asyncio.Transport):
    """A socket with no socket: what was written to it, when the FIN went out, how it ended
    (a reset or a close). With a protocol set on it (a relay's), an end is reported to it."""

    def __init__(self, loop: Loop) -> None:
        super().__init__()
        self.loop = loop
        self.protocol: Any = None
        self.out = b""
        self.eof_at: float | None = None
        self.closed_at: float | None = None
        self.reset = False  # aborted (a TCP reset), not closed

    @property
    def ended(self) -> tuple[str, float] | None:
        """("rst" or "fin", when), or None while open."""
        if self.closed_at is None:
            return None
        return ("rst" if self.reset else "fin", self.closed_at)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> Any:
        return self.protocol

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert self.eof_at is None and self.closed_at is None, "written after the end"
        self.out += bytes(data)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_at = self.loop.time()

    def close(self) -> None:
        if self.closed_at is None:
            self.closed_at = self.loop.time()
            if self.protocol is not None:
                self.protocol.connection_lost(None)

    def abort(self) -> None:
        self.reset = self.closed_at is None
        self.close()

    def is_closing(self) -> bool:
        return self.closed_at is not None

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def take(self) -> bytes:
        out, self.out = self.out, b""
        return out


class Connecting:
    """What ``ctx.connect`` returns: an upstream connection the script will make or fail."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.callbacks: list[Callable[[Any], None]] = []
        self.conn: Upstream | None = None
        self.error: Exception | None = None

    def add_done_callback(self, cb: Callable[[Any], None]) -> None:
        self.callbacks.append(cb)

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return self.conn is not None or self.error is not None

    def exception(self) -> Exception | None:
        return self.error

    def result(self) -> Upstream:
        assert self.conn is not None
        return self.conn

    def succeed(self, multiplexed: bool = False) -> Upstream:
        self.conn = Upstream(self.endpoint, multiplexed)
        for cb in self.callbacks:
            cb(self)
        return self.conn

    def succeed_h1(self, loop: Loop) -> tuple[H1Upstream, Transport]:
        """The real HTTP/1.1 upstream connection (its timers on ``loop``), on a socket with no
        socket: what it writes is in the transport, what the origin sends goes to
        ``data_received``."""
        conn = H1Upstream(self.endpoint, loop)
        transport = Transport(loop)
        transport.set_protocol(conn)
        conn.connection_made(transport)
        self.conn = conn  # type: ignore[assignment]
        for cb in self.callbacks:
            cb(self)
        return conn, transport

    def fail(self) -> None:
        self.error = ConnectionRefusedError()
        for cb in self.callbacks:
            cb(self)


class Upstream(UpstreamConn):
    """An upstream connection (or HTTP/2 stream): records what the exchange sent on it."""

    def __init__(self, endpoint: Endpoint, multiplexed: bool = False) -> None:
        super().__init__(multiplexed)
        self.endpoint = endpoint
        self.sent = b""
        self.ended = False
        self.closed = False
        self.timeout = 0.0  # the route timeout the exchange gave it at the request's end
        self.idle_timeout = 0.0

    @property
    def reusable(self) -> bool:
        return self.alive and not self.closed

    def start(self, sink: Any, head: Any) -> None:
        self.sink = sink
        self.head = head
        self.sent += b"%s %s HTTP/1.1\r\nhost: %s\r\n\r\n" % (head.method, head.path,
                                                             head.authority or b"")

    def write(self, data: bytes) -> None:
        self.sent += data

    def end(self, trailers: list[tuple[bytes, bytes]] | None, timeout: float,
            idle_timeout: float) -> None:
        self.ended = True
        self.timeout = timeout
        self.idle_timeout = idle_timeout

    def pause_reading(self) -> None:
        self.read_paused = True

    def resume_reading(self) -> None:
        self.read_paused = False

    def close(self) -> None:
        self.closed = True

    def take_over(self) -> None:
        return None

    def tunnel_closed(self) -> None:
        pass


class Context:
    """The listener's side: a router to one cluster, the process ledger, stats, connects."""

    def __init__(self, endpoints: int = 2, num_retries: int = 2, route_timeout: float = 0.0,
                 max_connecting: int = 0, per_try_idle_timeout: float = 0.0) -> None:
        self.loop = Loop()
        self.stats = HttpStats()
        self.process = ProcessDrain()
        self.process.initializing = False
        self.eps = [Endpoint("127.0.0.1", 9000 + i, 4, 1, EndpointDrain(),
                             max_connecting=max_connecting)
                    for i in range(endpoints)]
        self.cluster = Cluster("app", self.eps, 1.0, 30.0)
        self.cluster.clock = self.loop.time
        self.cluster.num_retries = num_retries
        # The back-off's jitter: the next draws, in order (then 0.5 each).
        self.draws: list[float] = []
        self.router = Router([Route("/", self.cluster, None, route_timeout,
                                    per_try_idle_timeout)])
        self.health_check_path: bytes | None = b"/healthz"
        self.probes = None  # no leave: confirm evidence here
        self.traffic = None
        self.alt_svc = None
        self.access_log = None  # off, as by default
        self.generate_request_id = False  # upstream heads stay as the cases write them
        # no x-envoy-upstream-service-time: the cases compare responses with what the upstream
        # sent, byte for byte (tests/unit/test_service_time.py turns it on)
        self.suppress_envoy_headers = True
        self.scheme = b"http"
        self.connects: list[Connecting] = []
        self.done = 0

    def rng(self) -> float:
        return self.draws.pop(0) if self.draws else 0.5

    def connect_target(self, authority: bytes | None) -> tuple[str, int] | None:
        return None

    def connect(self, cluster: Cluster, endpoint: Endpoint) -> Connecting:
        c = Connecting(endpoint)
        self.connects.append(c)
        return c

    def on_request_done(self) -> None:
        self.done += 1



class Listener(Context):
    """What a downstream connection's listener gives it (``ConnectionContext``), around the
    Exchange's context: the real H1Downstream and H2Downstream run on it with no socket."""

    def __init__(self, rng: Callable[[], float] | None = None, grace: float = 1.0) -> None:
        super().__init__()
        self.name = "ingress"
        self.drain = ListenerDrain("ingress", grace=grace)
        self.drain_stats = DrainStats()
        self.h2stats = Http2Stats()
        self.h3stats = Http3Stats()
        self.h2_limits = H2Limits()
        if rng is not None:
            self.rng = rng  # type: ignore[method-assign]
        self.connections: set[Any] = set()
        self.request_headers_timeout = 60.0
        self.idle_timeout = 100.0
        self.max_connection_duration = math.inf
        self.max_requests_per_connection = 0
        self.send_timeout = 20.0
        self.request_body_timeout = 15.0
        self.max_request_headers = 60 * 1024
        self.scheme = b"http"
        self.connect_timeout = 1.0
        self.closed: list[Any] = []

    def on_connection_closed(self, conn: Any) -> None:
        self.closed.append(conn)

    def upgrade_h2(self, conn: Any, data: bytes) -> bool:
        return False


class Downstream(ConnectionDownstream):
    """A client connection as the exchange sees it (``proxy.downstream.Downstream``): what
    the exchange asked the client's codec to do, in order."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.log: list[tuple[Any, ...]] = []
        self.held = False

    def answer(self, ex: Exchange, status: int, body: bytes,
               extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        self.log.append(("answer", status))
        ex.response_begun()
        ex.finish()

    def going_away(self, ex: Exchange) -> None:
        self.log.append(("going_away",))

    def hold_request(self, ex: Exchange) -> None:
        self.held = True

    def resume_request(self, ex: Exchange) -> None:
        self.held = False

    def release_request(self, ex: Exchange, credit: int) -> None:
        self.log.append(("release", credit))

    def send_informational(self, ex: Exchange, status: int, fields: Fields) -> None:
        self.log.append(("informational", status))

    def send_head(self, ex: Exchange, status: int, fields: Fields, length: int | None) -> None:
        self.log.append(("head", status))

    def send_whole(self, ex: Exchange, status: int, data: bytes, end: int,
                   fields: Fields | None) -> bool:
        return False

    def send_upgrade(self, ex: Exchange, fields: Fields, upgrade: bytes, rest: bytes) -> bool:
        return False

    def send_body(self, ex: Exchange, data: bytes) -> None:
        self.log.append(("body", data))

    def send_end(self, ex: Exchange, trailers: list[tuple[bytes, bytes]] | None) -> None:
        self.log.append(("end", trailers))

    def send_local(self, ex: Exchange, status: int, body: bytes,
                   extra: tuple[tuple[bytes, bytes], ...]) -> None:
        self.log.append(("local", status))

    def abort(self, ex: Exchange) -> None:
        self.log.append(("abort",))

    def cork(self) -> None:
        pass

    def uncork(self) -> None:
        pass

    def exchange_done(self, ex: Exchange) -> None:
        self.log.append(("done",))
        ex.settle(True)


def request(ctx: Context, method: bytes = b"GET", retryable: bool | None = None,
            body: bool = False) -> tuple[Exchange, Downstream]:
    """A request as a codec hands it over: admitted (or answered), head ready, started."""
    down = Downstream(ctx)
    ex = Exchange(down, method)
    ctx.stats.downstream_rq_active += 1
    fields: list[tuple[bytes, bytes]] = []
    if retryable:  # a key the application deduplicates by makes any method safe to send again
        fields.append((b"idempotency-key", b"k-1"))
    head = RequestHead(method, b"app", b"/x", fields, HTTP11)
    if body:
        head.has_body = True  # of unknown length: an HTTP/1.1 upstream gets it chunked
    else:
        ex.no_request_body()
    if ex.admit(ctx, head, Client("10.0.0.1", b"http", False)):
        ex.start()
    return ex, down


def pooled(ctx: Context, index: int, multiplexed: bool = False) -> Upstream:
    """An idle pooled connection to endpoint ``index`` (the next request reuses it)."""
    ep = ctx.eps[index]
    up = Upstream(ep, multiplexed)
    ep.idle.append(up)
    return up
