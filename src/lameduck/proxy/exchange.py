"""One request and its response, on any downstream and any upstream protocol.

The ``Exchange`` decides: admission (health-check path, route, ledger), persistence, the endpoint,
connect or reuse, the request body (held, kept for a replay, flow-controlled), the retry after a
failure, local errors and the books. It never touches bytes of a protocol: the downstream codec
connection carries its decisions out through ``Downstream`` (HTTP/1.1 formats a status line,
HTTP/2 sends HEADERS), and the upstream connection reports through ``ExchangeSink``. Envoy splits
its router filter from the codecs the same way; hypercorn drives both of its codecs through one
``HTTPStream``.

Retries (RFC 9110 §9.2.2, RFC 9113 §8.7) follow one table, ``drain.retry.decide``: a request
never sent (connect failed) may go anywhere, and to the same endpoint again after a jittered
back-off when no other can take it (HAProxy's ``retries``); one reset before any response byte
is sent again only if it is safe (idempotent method, ``Idempotency-Key`` or ``Resume-Seq``) and
its body is still kept (``REPLAY_LIMIT``); one an HTTP/2 upstream refused unprocessed may always
be sent again. Every retry needs the cluster's retry policy and budget
(``Cluster.retry_allowed``); a stale pooled connection is retried once on a fresh one to the same
endpoint.

A new HTTP/1.1 connection waits in line when its endpoint has ``max_connecting`` connects under
way (``Endpoint.may_connect``). The route timeout ends ``timeout`` after the later of the first
new connection and the end of the request: it covers the line, the connect, a back-off and
every retry (Envoy's route timeout spans the retries too), and the response to its last byte;
never the upload itself (Envoy's starts once the whole request is in). A request still without
an upstream then is answered 504; a response not complete by then is cut. The route's
``per_try_idle_timeout`` (Envoy's) bounds each try from the request's end: no upstream byte
for that long and the try is cut.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from lameduck.drain.endpoint import ConnAction, Layer
from lameduck.drain.probers import ProbeTracker
from lameduck.drain.retry import Failure, Retry, back_off, decide
from lameduck.proxy.accesslog import (
    CA,
    CB,
    DC,
    DPE,
    DR,
    GA,
    LR,
    NR,
    SV,
    UC,
    UF,
    UH,
    UPE,
    UR,
    URX,
    UT,
    keep_for_log,
)
from lameduck.proxy.admission import Client, persistence_key, prepare, route_path
from lameduck.proxy.local import (
    BODY_TIMEOUT_BODY,
    CUT_ANSWER,
    CUT_DROPPED,
    CUT_RESET,
    CUT_STATUS,
    GOING_AWAY_BODY,
    RETRY_AFTER,
)
from lameduck.proxy.message import HTTP11, SERVICE_TIME, STREAM, RequestHead
from lameduck.proxy.replay import REPLAY_LIMIT
from lameduck.upstream.connector import ExchangeSink, Fields, UpstreamConn, UpstreamError

if TYPE_CHECKING:
    from lameduck.drain import ProcessDrain
    from lameduck.proxy.accesslog import AccessLog
    from lameduck.proxy.downstream import Downstream
    from lameduck.stats import HttpStats
    from lameduck.upstream.cluster import Cluster
    from lameduck.upstream.pool import Endpoint
    from lameduck.upstream.router import Router

# Request bytes held for an upstream not attached yet before the client is paused (HTTP/2's
# window bounds them already).
BODY_BUFFER_LIMIT: Final = 256 * 1024
UPSTREAM_ERROR_BODY: Final = {
    UpstreamError.RESET: b"upstream reset before response\n",
    UpstreamError.CONNECT: b"upstream connect error\n",
    UpstreamError.TIMEOUT: b"upstream request timeout\n",
}


# The clock of x-envoy-upstream-service-time's end: CLOCK_MONOTONIC, the base of the loop's
# time that ``sent_at`` read (asyncio's loop.time() is time.monotonic(); uvloop's is libuv's
# uv_now, the same clock in ms at the iteration's start, so the figure may read up to a ms
# long). A C call: uvloop's loop.time() called by name from here cost about 400 instructions
# more per response (bench/instructions.sh --nginx).
service_clock: Callable[[], float] = time.monotonic


class ExchangeContext(Protocol):
    """What an exchange needs from its listener."""

    loop: asyncio.AbstractEventLoop
    stats: HttpStats
    process: ProcessDrain
    router: Router
    health_check_path: bytes | None
    # What the health-check path saw (``drain/probers.py``): every probe, when there is a
    # health-check path; ``traffic``, the same tracker while a preStop or a shutdown watches
    # for the balancer to let go (else None: no per-request cost).
    probes: ProbeTracker | None
    traffic: ProbeTracker | None
    rng: Callable[[], float]  # uniform in [0, 1): the retry back-off's jitter
    access_log: AccessLog | None  # None: off (nothing is formatted)
    generate_request_id: bool  # x-request-id when the client sent none (Envoy's default)
    suppress_envoy_headers: bool  # no x-envoy-upstream-service-time on proxied responses

    def connect_target(self, authority: bytes | None) -> tuple[str, int] | None: ...
    def connect(self, cluster: Cluster, endpoint: Endpoint) -> asyncio.Future[UpstreamConn]: ...
    def on_request_done(self) -> None: ...


class Exchange(ExchangeSink):
    """One request and its response, from its head to the last response byte.

    Defaults live on the class: a keep-alive GET sets a handful of attributes, not forty (this
    is allocated once per request, on the hot path).
    """

    head: RequestHead | None = None  # the head sent upstream (``admission.prepare``'s)
    local = False  # answered here (the codec sends it: at once, or queued in turn)
    expect = False  # "Expect: 100-continue": a local answer closes the connection
    admitted = False  # counted in the process ledger
    has_body = True
    req_done = False
    buffered: list[bytes] | None = None  # request bytes before an upstream is attached
    buffered_size = 0
    unacked = 0  # request bytes read and not yet handed on (flow-control credit)
    up_paused = False  # the upstream cannot take the request body faster
    held = False  # the client's request body is paused for this exchange
    cluster: Cluster | None = None
    endpoint: Endpoint | None = None
    route_timeout = 0.0
    idle_timeout = 0.0  # the route's per_try_idle_timeout
    # Loop time the route timeout ends: set at the first new connection, moved on at the
    # request's end.
    deadline = 0.0
    dialing = False  # counted in its endpoint's connects under way (``max_connecting``)
    queued = False  # in line for a connection to its endpoint
    reused = False  # on a pooled connection (it may have been closed by the upstream)
    retried = False  # sent again once on a fresh connection (a stale pooled one, a refusal)
    tries = 0  # retries on other endpoints (retry_policy.num_retries)
    retrying = False  # counted in the cluster's retries in flight (the retry budget)
    retryable = False  # idempotent method, Idempotency-Key or Resume-Seq (RFC 9110 §9.2.2)
    pkey: str | None = None  # persistence key: the source IP, or the cookie's record key
    set_cookie: bytes | None = None  # a persistence cookie to set: "name=value; Path=/..."
    can_replay = False  # what was sent upstream is kept (whole) for a retry
    replay: list[bytes] | None = None
    replay_size = 0
    status = 0
    resp_started = False
    te_trailers = False  # the client takes trailers (HTTP/1.1 "TE: trailers")
    req_trailers: list[tuple[bytes, bytes]] | None = None
    resp_done = False  # no more response bytes go out
    finished = False  # ``exchange_done`` was called
    upgrade = False  # a WebSocket: a 101 upstream turns it into a tunnel
    grpc = False  # a gRPC call: local answers are gRPC statuses
    connect: tuple[str, int] | None = None  # a CONNECT's destination (on the allow-list)
    # The access log's: Envoy's response flags (``accesslog``'s bits, set where each fact
    # happens), the body bytes each way, the request id, and -- only when the log is on --
    # the loop time of the head (``t0``: also what tells settle to log), the request fields
    # (path, (name, value) pairs, HTTP/1.1 lines) as the codec kept them, and the
    # few Envoy's default format logs, taken as the codec met them (``log_*``).
    flags = 0
    bytes_rx = 0
    bytes_tx = 0
    request_id = b""
    t0 = 0.0
    # downstream_rq_time runs from here: the codec's time of the request's head (a field it
    # already read, no clock read per request); 0 for a local answer to a malformed request
    started = 0.0
    log_req: tuple[bytes, list[tuple[bytes, bytes]], list[bytes] | None] | None = None
    log_host: bytes | None = None  # :authority (HTTP/1.1: the Host sent upstream)
    log_xff: bytes | None = None  # X-Forwarded-For (HTTP/1.1: as sent, the client appended)
    log_agent: bytes | None = None  # User-Agent
    log_opath: bytes | None = None  # X-Envoy-Original-Path
    resp_fields: Fields | None = None
    sent_at = 0.0  # loop time the request went upstream (upstream_rq_time)
    # x-envoy-upstream-service-time the response carries (ms), -1: none (``service_time``)
    svc_ms = -1

    def __init__(self, down: Downstream, method: bytes, version: int = HTTP11,
                 sid: int = 0) -> None:
        """``version``: the request's HTTP version (``message.HTTP10`` ...), 0 for a request
        line that is not HTTP/1.x (answered 400/505: no HEAD semantics); ``sid``: its stream
        id on a multiplexed connection (0 on HTTP/1.1)."""
        self.down = down
        self.sid = sid
        # Native references to what every request touches: a native field read instead of a
        # lookup by name on the (protocol-typed) downstream at each use.
        self.stats: HttpStats = down.ctx.stats
        self.method = method
        self.version = version
        self.is_head = method == b"HEAD" and version > 0
        # Set here, not as class defaults: mypyc leaves a protocol-typed default undefined.
        self.up: UpstreamConn | None = None
        # The one timer of the slow path: the route timeout while in line or connecting, or
        # the back-off before a retry.
        self.timer: asyncio.TimerHandle | None = None

    # -- what the codec tells it ----------------------------------------------------------------
    def head_received(self, at: float, path: bytes, fields: Fields, authority: bytes | None,
                      log: bool) -> None:
        """The request head arrived at loop time ``at`` (downstream_rq_time runs from here);
        with the access log on (``log``), what its line will read is kept."""
        self.started = at
        if log:
            self.t0 = at
            self.log_req = (path, fields, None)
            self.log_host = authority
            self.wants_fields = True
            keep_for_log(self, fields)

    def no_request_body(self) -> None:
        """The head ended the request (HTTP/2 END_STREAM): no body, nothing more to read."""
        self.has_body = False
        self.req_done = True

    def request_cut_short(self) -> None:
        """No more of the request will be read (a broken body, a body timeout, a reset): it
        counts as read for what waits on its end."""
        self.req_done = True

    def malformed(self) -> None:
        """The request broke its protocol (Envoy's DPE)."""
        self.flags |= DPE

    def answer_here(self, status: int, body_len: int) -> None:
        """Answered from here with ``status`` and a body of ``body_len`` bytes (none goes out
        to a HEAD), counted once; the codec sends it, at once or in turn. A byte stream has no
        status: its codec ends the connection, and its line reads 0 with the flag."""
        self.local = True
        if self.version == STREAM:
            return
        self.status = status
        self.bytes_tx = 0 if self.is_head else body_len
        self.stats.count_status(status)

    def refuse_malformed(self, status: int, body_len: int, at: float) -> None:
        """An answer to bytes that were no request (none was read whole): the books of a
        request never begun, its access-log line from ``at``."""
        self.flags = DPE
        self.answer_here(status, body_len)
        self.req_done = True
        if self.down.ctx.access_log is not None:
            self.t0 = at

    def log_unbooked(self, now: float) -> None:
        """The line of an exchange that was never on the books (nothing settles it)."""
        log: AccessLog | None = self.down.ctx.access_log
        if log is not None:
            log.record(self, now)

    def response_begun(self) -> None:
        """The first byte of its answer went to the client."""
        self.resp_started = True

    def response_over(self) -> None:
        """No more response bytes go out (the client reset the stream, or it was answered)."""
        self.resp_done = True

    def settled_here(self) -> None:
        """The codec settles it itself, not through ``finish`` (dropped unanswered as its
        connection closes, a tunnel that ended): a late callback finds it over."""
        self.finished = self.resp_done = True

    def take_unacked(self) -> int:
        """Flow-control credit read and never handed on: the codec gives it back now."""
        n, self.unacked = self.unacked, 0
        return n

    def switched_protocols(self) -> None:
        """The upstream's 101 went to the client: its status counted, the tunnel begins."""
        self.answered(101)
        self.resp_started = True

    # -- admission ----------------------------------------------------------------------------
    def admit(self, ctx: ExchangeContext, head: RequestHead, client: Client) -> bool:
        """Prepare the head sent upstream (``admission.prepare``), route the request and take
        it on the books; False: the downstream was told to answer it (malformed, health check,
        no route, going away)."""
        up = prepare(head, client)
        self.head = up
        self.has_body = head.has_body  # (a WebSocket's frames are no request body)
        self.request_id = up.request_id
        self.grpc = up.grpc
        self.expect = up.expect
        self.te_trailers = up.te_trailers
        self.upgrade = up.websocket
        if self.t0:  # the access log is on: X-Forwarded-For as sent, the authority routed by
            self.log_xff = up.forwarded_for
            self.log_host = up.authority
        refused = up.refused
        if refused is not None:
            if refused.malformed:
                self.flags |= DPE
            self.answer_local(refused.status, refused.body)
            return False
        path = route_path(up.path)
        host = up.authority
        hc = ctx.health_check_path
        if hc is not None and path == hc:
            live = ctx.process.live
            status = 200 if live else 503
            probes = ctx.probes
            if probes is not None:
                probes.probe(ctx.loop.time(), client.host, status)
            self.answer_local(status, b"OK\n" if live else b"DRAINING\n")
            return False
        traffic = ctx.traffic
        if traffic is not None:
            traffic.request(ctx.loop.time(), client.host)
        route = ctx.router.match(host, path)
        if route is None:
            self.flags |= NR
            self.answer_local(404, b"no route\n")
            return False
        cluster = route.cluster
        if self.upgrade and cluster.connector is not None:
            # an HTTP/2 cluster: a WebSocket would need RFC 8441 upstream, not supported
            self.answer_local(501, b"websocket to an HTTP/2 upstream not supported\n")
            return False
        if not self._on_books(ctx):
            return False
        self.retryable = up.retryable
        self.cluster = cluster
        if cluster.persistence is not None:
            self.pkey = persistence_key(up.fields, client.peer, cluster.by_cookie,
                                        cluster.cookie_name)
        self.route_timeout = route.timeout
        if route.per_try_idle_timeout:
            self.idle_timeout = route.per_try_idle_timeout
        return True

    def admit_connect(self, ctx: ExchangeContext, authority: bytes | None) -> bool:
        """A CONNECT: its destination if the listener allows it (else 403), on the books."""
        target = ctx.connect_target(authority)
        if target is None:
            self.answer_local(403, b"CONNECT not allowed\n")
            return False
        if not self._on_books(ctx):
            return False
        self.connect = target
        return True

    def admit_stream(self, cluster: Cluster, pkey: str | None, at: float, log: bool) -> bool:
        """An opaque byte stream (a TCP listener's connection, ``version`` STREAM) from loop
        time ``at``: no head to prepare or route, on the books for ``cluster`` (``pkey``: the
        source IP, with persistence), then picked, connected, retried and settled as a request
        is. False: past the drain time, the downstream was told to go away."""
        self.started = at
        if log:
            self.t0 = at
        if not self._on_books(self.down.ctx):
            return False
        self.cluster = cluster
        self.pkey = pkey
        return True

    def answer_local(self, status: int, body: bytes) -> None:
        """Answered from here, not by an upstream (admission refused it, or the codec could
        not read it as a request): booked here, sent by the codec."""
        self.answer_here(status, len(body))
        self.down.answer(self, status, body, self.down.local_fields())

    def _on_books(self, ctx: ExchangeContext) -> bool:
        """Counted in flight, or (past the drain time) turned away "going away"."""
        if not self.down.ledger.begin():
            self.stats.downstream_rq_going_away += 1
            self.flags |= GA
            self.down.going_away(self)
            return False
        self.admitted = True
        return True

    # -- request body ---------------------------------------------------------------------------
    def request_body(self, data: bytes, credit: int) -> None:
        """Request body bytes; ``credit``: the flow-control units they took (HTTP/2 counts
        padding; HTTP/1.1 passes their length and has no window to give back)."""
        if self.local or self.resp_done:
            if credit:
                self.down.release_request(self, credit)  # answered: read and dropped
            return
        up = self.up
        if up is not None and up.sink is self:
            if data:
                self.bytes_rx += len(data)
                if self.can_replay:
                    self._keep(data)
                up.write(data)
            if self.up_paused:
                self.unacked += credit
            elif credit:
                self.down.release_request(self, credit)
            return
        if data:
            if self.buffered is None:
                self.buffered = []
            self.buffered.append(data)
            self.buffered_size += len(data)
        self.unacked += credit  # given back once written upstream
        self.bytes_rx += len(data)
        if self.buffered_size > BODY_BUFFER_LIMIT and not self.held:
            self.held = True
            self.down.hold_request(self)

    def request_complete(self, trailers: list[tuple[bytes, bytes]] | None = None) -> None:
        """The request ended, with its trailer section (filtered) if it had one."""
        self.req_done = True
        if trailers:
            self.req_trailers = trailers
        if self.local or self.resp_done:
            if self.resp_started and self.local:
                self.finish()  # the local answer went out before the request had ended
            return
        timeout = self.route_timeout
        if timeout > 0:
            # The route timeout runs from here (Envoy); an upload may take as long as the
            # listener's body idle timeout lets it.
            self.deadline = self.down.loop.time() + timeout
        up = self.up
        if up is not None and up.sink is self:
            up.end(self.req_trailers, timeout, self.idle_timeout)
        # else ``attach`` ends it, after what was held

    def _keep(self, data: bytes) -> None:
        """Remember request bytes sent upstream, for a retry (bounded)."""
        size = self.replay_size + len(data)
        if size > REPLAY_LIMIT:
            self.can_replay = False  # too much to keep: a failure is answered, not retried
            self.replay = None
            return
        self.replay_size = size
        if self.replay is None:
            self.replay = [data]
        else:
            self.replay.append(data)

    # -- upstream -----------------------------------------------------------------------------
    def start(self) -> None:
        """Pick an endpoint and send the request: on a pooled connection, or a new one."""
        cluster = self.cluster
        assert cluster is not None
        ep = cluster.pick() if cluster.persistence is None else self._sticky(cluster)
        if ep is None:
            # no READY, healthy endpoint: 503 and when to come back (Envoy: no healthy upstream)
            cluster.stats.upstream_cx_none_healthy += 1
            self.flags |= UH
            self.local_error(503, b"no healthy upstream\n", RETRY_AFTER)
            return
        self.endpoint = ep
        # (a byte stream never takes a pooled HTTP connection of a cluster it shares)
        conn = ep.acquire() if self.head is not None else None
        if conn is not None:
            self.reused = True
            self.attach(conn)
        else:
            self.reused = False
            self._open(ep)

    def _sticky(self, cluster: Cluster) -> Endpoint | None:
        """The drain-stop persistence decision; a new record under a cookie sets the cookie."""
        key = self.pkey
        if self.version == STREAM:  # by source IP, and a Layer-4 record ends with the drain
            return cluster.pick_sticky(key, Layer.L4, cluster.clock(), False)[0]
        ep, now_key = cluster.pick_sticky(key, Layer.L7, cluster.clock(), cluster.by_cookie)
        if now_key is not None and now_key != key:
            self.pkey = now_key
            if cluster.by_cookie:
                self.set_cookie = b"%s=%s; Path=/; HttpOnly" % (cluster.cookie_name,
                                                               now_key.encode())
        return ep

    def _open(self, ep: Endpoint) -> None:
        """A new connection to ``ep``: opened now, or in line for the first free one when
        ``max_connecting`` connects to it are under way (an HTTP/2 cluster's connector places
        its streams itself, in the same line: ``upstream.shared.Placement``)."""
        cluster = self.cluster
        assert cluster is not None
        if not self.deadline and self.route_timeout > 0:
            self.deadline = self.down.loop.time() + self.route_timeout
        if cluster.connector is None and not ep.may_connect():
            self.queued = True
            ep.waiting.append(self._woken)
            cs = cluster.stats
            cs.upstream_rq_pending_total += 1
            cs.upstream_rq_pending_active += 1
            self._arm_deadline()
            return
        self._dial(ep)

    def _dial(self, ep: Endpoint) -> None:
        cluster = self.cluster
        assert cluster is not None
        if cluster.connector is None:  # one connection per exchange: counted against the cap
            ep.connecting += 1
            self.dialing = True
        fut = self.down.ctx.connect(cluster, ep)
        if not fut.done():
            self._arm_deadline()
        fut.add_done_callback(self._connected)

    def _arm_deadline(self) -> None:
        if self.deadline and self.timer is None:
            self.timer = self.down.loop.call_at(self.deadline, self._no_upstream_in_time)

    def _no_upstream_in_time(self) -> None:
        """The route timeout ended in line or while connecting: 504, as Envoy answers it."""
        self.timer = None
        if self.down.loop.time() < self.deadline:  # the request ended meanwhile
            self._arm_deadline()
            return
        ep = self.endpoint
        cluster = self.cluster
        assert cluster is not None and ep is not None
        if self.queued:
            self._leave_line(ep)
        if self.resp_done or self.down.gone:
            return
        cluster.stats.upstream_rq_timeout += 1
        ep.rq_timeout += 1
        self.flags |= UT
        cluster.upstream_error(ep, "connect timeout" if self.dialing else "timeout in line")
        self.local_error(UpstreamError.TIMEOUT, UPSTREAM_ERROR_BODY[UpstreamError.TIMEOUT])

    def _woken(self) -> None:
        """A connection to this request's endpoint became free: a pooled one to take, or a
        connect slot. Nothing free after all (a new request took it): first in line again."""
        ep = self.endpoint
        assert ep is not None
        if not self.queued:
            self._wake_next(ep)  # gave up meanwhile: the turn passes on
            return
        down = self.down
        if self.resp_done or down.gone or down.closing:
            self._left_line()
            self._wake_next(ep)
            return
        conn = ep.acquire() if self.head is not None else None
        if conn is not None:
            self._left_line()
            self._stop_timer()  # the upstream keeps what is left of the route timeout
            self.reused = True
            self.attach(conn)
        elif ep.may_connect_next():
            self._left_line()
            self._dial(ep)  # the deadline timer runs on through the connect
        else:
            ep.waiting.appendleft(self._woken)

    def _wake_next(self, ep: Endpoint) -> None:
        """A connection to ``ep`` became free: the first in line gets its turn (soon, not
        from inside the codec callback that freed it)."""
        wake = ep.next_waiting()
        if wake is not None:
            self.down.loop.call_soon(wake)

    def _left_line(self) -> None:
        self.queued = False
        assert self.cluster is not None
        self.cluster.stats.upstream_rq_pending_active -= 1

    def _leave_line(self, ep: Endpoint) -> None:
        ep.leave_line(self._woken)
        self._left_line()

    def _stop_timer(self) -> None:
        timer = self.timer
        if timer is not None:
            self.timer = None
            timer.cancel()

    def _stop_waiting(self) -> None:
        """The exchange ends: no timer fires for it, and it leaves the line."""
        self._stop_timer()
        if self.queued:
            ep = self.endpoint
            assert ep is not None
            self._leave_line(ep)

    def _connected(self, fut: asyncio.Future[UpstreamConn]) -> None:
        self._stop_timer()
        ep = self.endpoint
        assert ep is not None
        if self.dialing:
            self.dialing = False
            ep.connecting -= 1
            self._wake_next(ep)
        if self.resp_done or self.down.gone:
            if not fut.cancelled() and fut.exception() is None:
                self._spare(fut.result(), ep)
            return
        if fut.cancelled() or fut.exception() is not None:
            self._never_sent()
            return
        self.attach(fut.result())

    def _spare(self, conn: UpstreamConn, ep: Endpoint) -> None:
        """A new connection this exchange no longer needs: pooled for the next request (one in
        line takes it), closed if it cannot be."""
        cluster = self.cluster
        assert cluster is not None
        if cluster.connector is None and conn.reusable and ep.release(conn, cluster.clock()):
            self._wake_next(ep)
            return
        conn.close()

    def _never_sent(self) -> None:
        """The connection failed before the request went: any request may go elsewhere."""
        cluster = self.cluster
        ep = self.endpoint
        assert cluster is not None and ep is not None
        cluster.connect_failed(ep)
        action, _ = decide(Failure.CONNECT, started=self.resp_started, kept=True,
                           idempotent=self.retryable, stale=False, retried=self.retried)
        if (action is Retry.ELSEWHERE or action is Retry.ELSEWHERE_OR_LATER) and \
                self._retry_elsewhere(later=action is Retry.ELSEWHERE_OR_LATER):
            return
        self.flags |= UF
        self.local_error(UpstreamError.CONNECT, UPSTREAM_ERROR_BODY[UpstreamError.CONNECT])

    def _retry_elsewhere(self, later: bool = False) -> bool:
        """Send the request to another endpoint if the policy and budget allow (the caller
        has checked that it is safe); ``later``: else to the same one after a back-off."""
        cluster = self.cluster
        ep = self.endpoint
        assert cluster is not None and ep is not None
        down = self.down
        if self.resp_started or down.gone or down.closing:
            return False
        if not cluster.retry_allowed(self.tries, self.retrying):
            if self.tries:
                self.flags |= URX  # retried, and the policy or the budget allows no more
            return False
        target = cluster.pick(ep)
        if target is None:
            return later and self._retry_later(ep)
        self.tries += 1
        self._retry(target)
        return True

    def _retry_later(self, ep: Endpoint) -> bool:
        """The same endpoint again after a jittered back-off; False when the route timeout
        would end first (the request is answered now rather than at its deadline)."""
        cluster = self.cluster
        assert cluster is not None
        ctx = self.down.ctx
        loop = self.down.loop
        at = loop.time() + back_off(self.tries + 1, cluster.back_off_base,
                                    cluster.back_off_max, ctx.rng)
        if self.deadline and at >= self.deadline:
            return False
        self.tries += 1
        self._stop_timer()
        self.timer = loop.call_at(at, self._backed_off)
        return True

    def _backed_off(self) -> None:
        self.timer = None
        ep = self.endpoint
        assert ep is not None
        if self.resp_done or self.down.gone or self.down.closing:
            return
        self._retry(ep)

    def attach(self, up: UpstreamConn) -> None:
        down = self.down
        if self.resp_done or down.closing:
            up.close()  # cut or answered meanwhile: this request is not sent
            return
        self.up = up
        cluster = self.cluster
        ep = self.endpoint
        assert cluster is not None and ep is not None
        cs = cluster.stats
        cs.upstream_rq_total += 1
        cs.upstream_rq_active += 1
        ep.rq_total += 1
        ep.rq_active += 1
        # Kept for a retry: a safe request (idempotent, Idempotency-Key, Resume-Seq), or any
        # request on an HTTP/2 stream (which the upstream may refuse as unprocessed).
        self.can_replay = self.retryable or up.multiplexed
        if not up.alive:  # lost between the pool (or the connect) and now
            if self.reused:
                self.on_upstream_error(UpstreamError.RESET, False)
            else:
                self._detach(reusable=False)
                self._never_sent()
            return
        if down.write_paused:
            up.pause_reading()  # the client is behind: this response waits for it too
        self.sent_at = down.loop.time()
        up.start(self, self.head)  # None for a byte stream: its relay starts
        if not self._holds(up):
            return  # refused at once (an HTTP/2 connection that went away): retried or answered
        if self.buffered:
            for piece in self.buffered:
                if self.can_replay:
                    self._keep(piece)
                up.write(piece)
            self.buffered = None
            self.buffered_size = 0
        if self.held:
            self.held = False
            if not self.up_paused:  # the upstream may have paused it meanwhile
                down.resume_request(self)
        if self.req_done and up.sink is self:
            timeout = self.route_timeout
            if self.deadline:  # what is left of it after the line, the connect, the retries
                timeout = max(self.deadline - down.loop.time(), 0.001)
            up.end(self.req_trailers, timeout, self.idle_timeout)
        if self.unacked and not self.up_paused:
            n, self.unacked = self.unacked, 0
            down.release_request(self, n)

    def _holds(self, up: UpstreamConn) -> bool:
        """Still attached to ``up`` (a call may have let it go: read anew, not the type the
        attach narrowed ``self.up`` to)."""
        return self.up is up

    def _detach(self, reusable: bool) -> None:
        up = self.up
        if up is None:
            return
        self.up = None
        cluster = self.cluster
        ep = self.endpoint
        assert cluster is not None and ep is not None
        cluster.stats.upstream_rq_active -= 1
        ep.rq_active -= 1
        if up.sink is self:
            up.sink = None
        # A flow-control pause on either side belongs to this exchange, not to what comes next.
        if self.up_paused:
            self.up_paused = False
            self.down.resume_request(self)
        if up.read_paused:
            up.resume_reading()
        if (reusable and self.req_done and up.reusable
                and ep.release(up, cluster.clock())):
            if ep.waiting:
                self._wake_next(ep)  # the first in line takes it
            return
        up.close()

    def detach(self) -> None:
        """The exchange ends without its upstream (cut, reset, connection lost)."""
        self._stop_waiting()
        self._detach(reusable=False)

    # -- ExchangeSink: what the upstream reports ------------------------------------------------
    # RFC 9110 §15: a status code is three digits from 100 to 599. llhttp passes 000-999, so
    # an HTTP/1.1 upstream's is checked here (an HTTP/2 :status out of range is already a
    # stream error: proxy.sections.classify).
    def on_informational(self, status: int, fields: Fields) -> None:
        if status < 100:
            self.upstream_protocol_error()
        elif not self.resp_started:
            self.down.send_informational(self, status, fields)

    def on_response_head(
        self, status: int, fields: Fields, length: int | None, chunked: bool,
    ) -> None:
        if status > 599:
            self.upstream_protocol_error()
            return
        self.answered(status)
        self.resp_started = True
        self.resp_fields = fields
        self.service_time()
        self.down.send_head(self, status, fields, length)

    def head_fields(self, fields: Fields) -> Fields:
        """The response fields a multiplexed codec (HTTP/2, HTTP/3) sends, from the
        upstream's: x-envoy-upstream-service-time ours in place of the upstream's (Envoy's
        router overwrites it), and the persistence cookie to set."""
        svc = self.svc_ms
        if svc >= 0:
            fields = [f for f in fields if len(f[0]) != 29 or f[0].lower() != SERVICE_TIME]
            fields.append((SERVICE_TIME, b"%d" % svc))
        if self.set_cookie is not None:
            fields = [*fields, (b"set-cookie", self.set_cookie)]
        return fields

    def service_time(self) -> None:
        """Envoy's router adds ``x-envoy-upstream-service-time`` to a response it proxies:
        the ms from the request sent upstream to its response head (Envoy's HTTP header
        docs), unless ``suppress_envoy_headers``. Kept as ``svc_ms`` for the codec to add
        (in place of one the upstream sent) and the access log's %RESP()% to read."""
        if self.down.envoy_headers:
            self.svc_ms = int((service_clock() - self.sent_at) * 1000.0)

    def answered(self, status: int) -> None:
        """The upstream answered: count the status; no retry from here on."""
        self.status = status
        if self.can_replay:
            self.can_replay = False
            self.replay = None
        cluster = self.cluster
        ep = self.endpoint
        assert cluster is not None and ep is not None
        cs = cluster.stats
        if 200 <= status < 300:
            cs.upstream_rq_2xx += 1
            self.stats.downstream_rq_2xx += 1
            cluster.request_ok(ep)
        else:
            cs.count_status(status)
            self.stats.count_status(status)
            if status >= 500:
                cluster.request_failed(ep, 502 <= status <= 504)
            else:
                cluster.request_ok(ep)

    def on_whole_response(self, status: int, data: bytes, end: int,
                          fields: Fields | None) -> bool:
        """A complete plain response in one piece (see ``http1.wire.whole_response``): the
        downstream may forward it as it came. False: the caller parses it instead."""
        if self.set_cookie is not None or not self.req_done:
            return False
        self.service_time()
        if not self.down.send_whole(self, status, data, end, fields):
            return False
        self.resp_fields = fields
        self.answered(status)
        self.resp_started = True
        self.bytes_tx = len(data) - end - 4  # the body: after the head's blank line
        self._detach(reusable=True)
        self.finish()
        return True

    def on_upgrade(self, fields: Fields, upgrade: bytes, rest: bytes) -> bool:
        """The upstream switched protocols (101). False when this request did not ask for it
        (the caller fails the exchange)."""
        if not self.upgrade or self.down.closing:
            return False
        return self.down.send_upgrade(self, fields, upgrade, rest)

    def on_response_body(self, data: bytes) -> None:
        self.bytes_tx += len(data)
        self.down.send_body(self, data)

    def on_response_complete(self, trailers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.down.send_end(self, trailers)
        self._detach(reusable=True)
        self.finish()

    def on_upstream_error(self, status: int, after_head: bool, idle: bool = False) -> None:
        cluster = self.cluster
        ep = self.endpoint
        assert cluster is not None and ep is not None
        cs = cluster.stats
        up_was = self.up
        can_replay = self.can_replay
        self._detach(reusable=False)
        if idle:
            cs.upstream_rq_per_try_idle_timeout += 1
            ep.rq_timeout += 1
        elif status == UpstreamError.TIMEOUT:
            cs.upstream_rq_timeout += 1
            ep.rq_timeout += 1
        else:
            cs.upstream_rq_rx_reset += 1
        self.flags |= self._upstream_flags(status, up_was)
        down = self.down
        failure = (Failure.AFTER_HEAD if after_head else
                   Failure.TIMEOUT if status == UpstreamError.TIMEOUT else Failure.RESET)
        stale = self.reused and up_was is not None and not up_was.got_bytes
        action, code = decide(failure, started=self.resp_started, kept=can_replay,
                              idempotent=self.retryable, stale=stale, retried=self.retried)
        if action is not Retry.FRESH:  # a stale pooled connection is no fault of the origin
            cluster.upstream_error(ep, "per-try idle timeout" if idle else "timeout"
                                   if status == UpstreamError.TIMEOUT else "reset")
        if action is Retry.ABORT:
            # Bytes of this response already went out (its status was counted): the client
            # can only see a reset.
            self.flags |= LR
            down.abort(self)
            return
        if action is Retry.FRESH and not down.gone:
            # A pooled connection the upstream had already closed: once more on a fresh one
            # to the same endpoint, replaying what was sent.
            self._retry(ep)
            return
        cluster.request_failed(ep, True)
        if action is Retry.ELSEWHERE and self._retry_elsewhere():
            return
        self.local_error(code, UPSTREAM_ERROR_BODY[code])

    def upstream_protocol_error(self) -> None:
        """The upstream's response is no HTTP response (a status outside 100-599): as
        Envoy, an upstream protocol error — 502 to the client, flagged UPE, counted as the
        cluster's upstream_cx_protocol_error and as an upstream 5xx (its endpoint's too, for
        outlier detection). Never retried: the upstream answered. Its connection is closed:
        what follows on it cannot be framed."""
        cluster = self.cluster
        ep = self.endpoint
        assert cluster is not None and ep is not None
        cs = cluster.stats
        cs.upstream_cx_protocol_error += 1
        cs.count_status(UpstreamError.RESET)  # upstream_rq_5xx (Envoy's router charges the 502)
        self.can_replay = False
        self.replay = None
        self._detach(reusable=False)
        self.flags |= UPE
        cluster.upstream_error(ep, "protocol error")
        cluster.request_failed(ep, True)
        self.local_error(UpstreamError.RESET, UPSTREAM_ERROR_BODY[UpstreamError.RESET])

    def _upstream_flags(self, status: int, up: UpstreamConn | None) -> int:
        """The response flags of an upstream failure: UT, or UR (an HTTP/2 stream reset) /
        UC (its connection ended); SV when the endpoint's drain stop severed it."""
        if status == UpstreamError.TIMEOUT:
            return UT
        flags = UR if up is not None and up.multiplexed else UC
        cluster = self.cluster
        ep = self.endpoint
        if (cluster is not None and ep is not None
                and ep.drain.connections(cluster.clock()) is ConnAction.DROP):
            flags |= SV
        return flags

    def on_upstream_idle(self, after_head: bool) -> None:
        """The per_try_idle_timeout cut the try: 504 as a timeout (never retried: the request
        may still run), or a reset if the response had started."""
        self.on_upstream_error(UpstreamError.TIMEOUT, after_head, True)

    def on_upstream_refused(self) -> None:
        """HTTP/2 proved it unprocessed (RFC 9113 §8.7): sent again, to another endpoint if
        there is one, with the body sent so far (kept up to REPLAY_LIMIT)."""
        can_replay = self.can_replay
        ep = self.endpoint
        assert ep is not None
        self._detach(reusable=False)
        action, _ = decide(Failure.REFUSED, started=self.resp_started, kept=can_replay,
                           idempotent=self.retryable, stale=False, retried=self.retried)
        self.flags |= UR
        if action is Retry.ABORT:
            self.flags |= LR
            self.down.abort(self)
            return
        if action is not Retry.FAIL and not self.down.gone:
            if self._retry_elsewhere():
                return
            if action is Retry.ELSEWHERE_OR_FRESH:
                self._retry(ep)  # no other endpoint: a fresh connection to the same one
                return
        assert self.cluster is not None
        self.cluster.stats.upstream_rq_rx_reset += 1
        self.local_error(503, b"upstream refused the request\n")

    def _retry(self, target: Endpoint) -> None:
        """Send the request again to ``target`` on a fresh connection, replaying what was
        sent."""
        self.retried = True
        self.can_replay = False
        cluster = self.cluster
        assert cluster is not None
        self.retrying = cluster.retry_started(self.retrying)
        if self.replay:
            self.buffered = self.replay + (self.buffered or [])
            self.buffered_size += self.replay_size
        self.replay = None
        self.replay_size = 0
        self.reused = False
        if target is not self.endpoint:
            self.endpoint = target
            if self.pkey is not None:
                cluster.rebind(self.pkey, target, cluster.clock())
        self._open(target)

    def local_error(self, status: int, body: bytes,
                    extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """Answer with a local error response, unless the response already started."""
        down = self.down
        if down.closing or self.resp_done:
            return  # cut at the deadline meanwhile: its answer went out already
        self.answer_here(status, len(body))
        self.resp_started = True
        alt = down.local_fields()
        down.send_local(self, status, body, (*extra, *alt) if alt else extra)
        self.finish()

    def pause_request_body(self) -> None:
        if not self.up_paused:
            self.up_paused = True
            self.down.hold_request(self)

    def resume_request_body(self) -> None:
        if self.up_paused:
            self.up_paused = False
            if not self.held:
                self.down.resume_request(self)
            if self.unacked and self.up is not None:
                n, self.unacked = self.unacked, 0
                self.down.release_request(self, n)

    def cork(self) -> None:
        self.down.cork()

    def uncork(self) -> None:
        self.down.uncork()

    # -- tunnels (CONNECT, WebSocket): what the client got, and the bytes relayed ---------------
    def tunnel_opened(self, status: int) -> None:
        """The tunnel is up: ``status`` is what the client got (200 to a CONNECT or an HTTP/2
        WebSocket, RFC 9110 §9.3.6 / RFC 8441 §5), counted once for the listener."""
        self.status = status
        self.resp_started = True
        self.stats.count_status(status)

    def tunnel_refused(self, status: int, body: bytes) -> None:
        """A CONNECT's destination could not be reached: the answer the codec sends, flagged
        UF as Envoy flags an upstream connection failure."""
        self.status = status
        self.flags |= UF
        self.resp_started = True
        self.bytes_tx = len(body)
        self.stats.count_status(status)

    def tunnel_closed(self, cut: bool, rx: int, tx: int) -> None:
        """Both ends of the tunnel are closed: the bytes relayed each way (``rx`` from the
        client) are the request's and the response's; a tunnel the drain ended is off the
        books as cut (CA)."""
        self.bytes_rx += rx
        self.bytes_tx += tx
        self.resp_done = True
        if cut and self.admitted:
            self.cut_off()

    # -- end --------------------------------------------------------------------------------
    def settle(self, completed: bool) -> None:
        """Off the books, however it ended: the gauges, the retry budget and the ledger (which
        a shutdown waits on)."""
        st = self.stats
        st.downstream_rq_active -= 1
        if self.timer is not None or self.queued:
            self._stop_waiting()
        if self.retrying:  # every way an exchange ends comes here: its retry slot is given back
            self.retrying = False
            assert self.cluster is not None
            # answered below 500, or (a byte stream) relayed
            self.cluster.retry_ended(0 < self.status < 500
                                     or (self.version == STREAM and self.sent_at > 0))
        done = completed and self.resp_started
        if self.admitted:
            self.admitted = False
            ledger = self.down.ledger
            if done:
                ledger.end()
            else:
                ledger.abandon()
            if ledger.draining:  # a shutdown is waiting for the ledger to empty
                self.down.ctx.on_request_done()
        now = 0.0
        if done:
            st.downstream_rq_completed += 1
            now = self.down.loop.time()
            if self.started:
                st.downstream_rq_time.record((now - self.started) * 1000.0)
            if self.status and self.sent_at and self.cluster is not None:  # answered upstream
                self.cluster.stats.upstream_rq_time.record((now - self.sent_at) * 1000.0)
        if self.t0:  # the access log is on
            self._log(completed, now)

    def _log(self, completed: bool, now: float) -> None:
        """The access log line, at settle (``now``: the loop time read for the stats, or 0):
        the connection's drain facts join this request's."""
        down = self.down
        self.flags |= down.drain_flags
        ctx = down.ctx
        log: AccessLog | None = ctx.access_log  # typed: a native call, ``now`` unboxed
        if log is not None:
            log.record(self, now or down.loop.time())

    def client_gone(self, stream_reset: bool = False) -> None:
        """The client went away with this exchange in flight: its connection closed, or it
        half-closed an HTTP/1.1 connection before this response was complete (Envoy's
        connection manager takes a downstream FIN as the connection's end; RFC 9112 §9.6 gives
        a half-close no meaning a server must wait out), or (``stream_reset``) it reset this
        HTTP/2 stream. Nobody is left to answer: the upstream request is cut (its connection
        closed, never pooled mid-response; an HTTP/2 stream cancelled), and the exchange ends
        unanswered, flagged DC (Envoy's DownstreamConnectionTermination) or DR
        (DownstreamRemoteReset) with the status already sent if the response head went out,
        0 if none did (nginx logs 499). Not when lameduck reset the connection, nor when the
        drain's cut ended it first (CA/CB). The codec then settles it."""
        self.resp_done = True
        self.detach()
        if not self.down.aborted and not self.flags & (CA | CB):
            self.flags |= DR if stream_reset else DC

    def cut_off(self) -> bool:
        """The shutdown deadline (or a drain's end for a tunnel) cut this request: off the
        books as cut, flagged CB or CA. True when its response had started (the client sees a
        reset); False: none had (``deadline_cut`` answers it 503 going away)."""
        ctx = self.down.ctx
        self.down.ledger.cut_one()
        self.admitted = False
        ds = ctx.drain_stats
        if self.resp_started:
            ds.cut_reset += 1
            self.flags |= CA
            return True
        ds.cut_before_response += 1
        self.flags |= CB
        return False

    def finish(self) -> None:
        """The response went out whole (or the exchange was answered from here)."""
        if self.finished:
            return
        self.finished = True
        self.resp_done = True
        self.down.exchange_done(self)

    # -- the shutdown deadline and the request body timeout: decided here, the codec sends ------
    def deadline_cut(self, answerable: bool = True) -> int:
        """The shutdown deadline cut this request on the books (what a drain leaves is cut
        then, as Envoy's parent shutdown time ends a draining process): its upstream let go,
        no more response bytes from there (a connect still pending finds it over), off the
        books as cut (``cut_off``: CA or CB). What the codec sends: ``CUT_RESET`` once its
        response had started (the client can only see a reset), or ``CUT_STATUS`` for a gRPC
        call whose response is still open (trailers with UNAVAILABLE); before any response
        byte, ``CUT_ANSWER``: 503 ``GOING_AWAY_BODY`` with Retry-After (RFC 9110 §15.6.4),
        booked here; or ``CUT_DROPPED`` when it cannot be answered (``answerable`` False:
        HTTP/1.1 pipelined behind another, RFC 9112 §9.3.2)."""
        status = self.grpc and not self.resp_done
        self.detach()
        self.resp_done = True
        if self.cut_off():
            return CUT_STATUS if status else CUT_RESET
        if not answerable:
            return CUT_DROPPED
        self.answer_here(503, len(GOING_AWAY_BODY))
        return CUT_ANSWER

    def body_timed_out(self) -> bool:
        """No byte of its request body for request_body_timeout (nginx
        ``client_body_timeout``), counted as downstream_rq_body_timeout; its upstream let go,
        and the codec reads no more of it. True: a response byte had gone out, so the client
        can only see a reset (the codec resets); else it was answered 408 (RFC 9110
        §15.5.9) ``BODY_TIMEOUT_BODY`` from here (``local_error``: the codec's
        ``send_local``)."""
        self.stats.downstream_rq_body_timeout += 1
        self.detach()
        if self.resp_started:
            return True
        self.local_error(408, BODY_TIMEOUT_BODY)
        return False
