#!/usr/bin/env python3
"""h3load: an HTTP/3 load generator for bench/run.py, shaped like h2load's ``-c -m -n -D``.

h2load here (nghttp2 1.52, Debian) has no QUIC and no C QUIC client is packaged, so the bench's
HTTP/3 row is loaded by this: C QUIC connections (RFC 9000) to one 127.0.0.1 URL, M requests
(GET, RFC 9114 §4.1) in flight on each, a new one sent as each response ends, until N are done
or the duration is over. It is built to cost as little per request as Python allows, since it
shares the load core with the origin: one event loop (uvloop when installed), the QUIC and
HTTP/3 state machines of qh3 (aioquic's fork, its QUIC core in Rust) or aioquic (``--stack``)
driven directly (no asyncio stream or future per request), a connection's datagrams sent once
per pass of the loop (after every datagram it read in that pass, as a client that reads its
socket dry before writing does: about a fifth less CPU per request than sending after each),
and no per-request state beyond the stack's own (a counter per connection; the request's
header list is built once).

Phases, printed (and flushed) as they happen so that a caller can sample CPU counters there,
as bench/run.py does with h2load's phase lines:

    h3load: warm-up started          (with --warm-up-time)
    h3load: main period started
    h3load: main period over
    h3load: requests=N errors=E elapsed=S rps=R cpu_us_per_req=U cpu_pct=P statuses=...

The last line is the result of the main period only (warm-up excluded): responses that ended
with a 2xx (``requests``), requests that failed (a non-2xx status, a reset stream, a
connection that ended under them: ``errors``), the main period's wall seconds, and this
process's own CPU time (user + system, ``time.process_time``) over those requests. Exit code
0 when every request of the main period succeeded and at least one did, 1 otherwise, 2 on bad
arguments. TLS certificates are not verified (the bench's are self-signed and throw-away);
only 127.0.0.1 is accepted as the host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import re
import ssl
import sys
import time
from typing import Any
from urllib.parse import urlsplit

# qh3 (aioquic's fork, its QUIC core and TLS in Rust) first: about half aioquic's CPU per
# request here; "auto" takes the first one installed.
STACKS = ("qh3", "aioquic")
RESULT = re.compile(
    r"^h3load: requests=(\d+) errors=(\d+) elapsed=([\d.]+) rps=([\d.]+) "
    r"cpu_us_per_req=([\d.]+) cpu_pct=([\d.]+)(?: statuses=(\S*))?$", re.M)
WARMUP_STARTED = "h3load: warm-up started"
MAIN_STARTED = "h3load: main period started"
MAIN_OVER = "h3load: main period over"
# After the main period: how long connections get to say CONNECTION_CLOSE before the loop ends.
CLOSE_GRACE = 0.2
# A connection whose handshake has not completed by then fails the run (nothing listens, or
# the server does not speak h3).
HANDSHAKE_TIMEOUT = 10.0
# -T's default: the main period ends by then whatever -n and -D say (a server that stops
# answering does not hold the run).
MAX_TIME = 300.0


@dataclasses.dataclass(frozen=True)
class Args:
    host: str
    port: int
    authority: bytes
    path: bytes
    clients: int
    streams: int
    requests: int  # 0: no count limit (then duration is)
    duration: float  # 0: no time limit but max_time (then requests is)
    max_time: float  # the main period's bound when -n is not done sooner
    warmup: float
    stack: str


def parse_args(argv: list[str] | None) -> Args:
    p = argparse.ArgumentParser(prog="bench/h3load.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="https://127.0.0.1:PORT/PATH (loopback only)")
    p.add_argument("-c", "--clients", type=int, default=1, help="QUIC connections (1)")
    p.add_argument("-m", "--max-concurrent-streams", type=int, default=1, dest="streams",
                   help="requests in flight per connection (1)")
    p.add_argument("-n", "--requests", type=int, default=None,
                   help="requests to complete in the main period (default: 1 when no -D; "
                   "with -D, none: the duration ends it)")
    p.add_argument("-D", "--duration", type=float, default=0.0,
                   help="seconds of the main period at most (0: until -n are done)")
    p.add_argument("-T", "--max-time", type=float, default=MAX_TIME,
                   help=f"seconds of the main period at most, -D or not ({MAX_TIME:g}): -n "
                   "not done by then is a failed run")
    p.add_argument("--warm-up-time", type=float, default=0.0, dest="warmup",
                   help="seconds of load before the main period, not counted (0)")
    p.add_argument("--stack", choices=("auto", *STACKS), default="auto",
                   help="QUIC + HTTP/3 implementation (auto: qh3 if installed, else aioquic)")
    a = p.parse_args(argv)
    u = urlsplit(a.url)
    if u.scheme != "https" or u.hostname != "127.0.0.1" or not u.port:
        p.error(f"{a.url}: give https://127.0.0.1:PORT/... (load goes to loopback only)")
    if a.clients < 1 or a.streams < 1 or a.duration < 0 or a.warmup < 0 or a.max_time <= 0:
        p.error("-c, -m and -T must be positive, -D and --warm-up-time not negative")
    requests = a.requests if a.requests is not None else (0 if a.duration else 1)
    if requests < 0 or (requests == 0 and not a.duration):
        p.error("-n must be positive, or give -D")
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    return Args(host="127.0.0.1", port=u.port, authority=f"127.0.0.1:{u.port}".encode(),
                path=path.encode(), clients=a.clients, streams=a.streams, requests=requests,
                duration=a.duration, max_time=a.max_time, warmup=a.warmup, stack=a.stack)


def parse_result(out: str) -> dict[str, Any] | None:
    """The last result line of an h3load run, or None when it printed none."""
    found = RESULT.findall(out)
    if not found:
        return None
    req, err, elapsed, rps, us, pct, statuses = found[-1]
    codes = {}
    for item in filter(None, (statuses or "").split(",")):
        code, _, n = item.partition(":")
        codes[code] = int(n)
    return {"requests": int(req), "errors": int(err), "elapsed": float(elapsed),
            "rps": float(rps), "cpu_us_per_req": float(us), "cpu_pct": float(pct),
            "statuses": codes}


class Load:
    """What all connections share: the phase, the counts, the budget of requests to send."""

    def __init__(self, args: Args, loop: asyncio.AbstractEventLoop, stack: Any) -> None:
        self.args = args
        self.loop = loop
        self.stack = stack
        self.measuring = False
        self.sending = True
        self.done = 0  # 2xx responses ended in the main period
        self.errors = 0
        self.statuses: dict[bytes, int] = {}  # non-2xx statuses and failures, by name
        self.unsent = args.requests  # main-period requests left to send (0 with no -n: none)
        self.finished = loop.create_future()
        self.conns: list[Conn] = []
        self.fields = [(b":method", b"GET"), (b":scheme", b"https"),
                       (b":authority", args.authority), (b":path", args.path),
                       (b"user-agent", b"h3load")]

    def may_send(self) -> bool:
        """Whether a connection may send one more request now (and take it off the budget)."""
        if not self.sending:
            return False
        if self.measuring and self.args.requests:
            if self.unsent <= 0:
                return False
            self.unsent -= 1
        return True

    def ended(self, ok: bool, what: bytes) -> None:
        if not self.measuring:
            return
        if ok:
            self.done += 1
            if self.args.requests and self.done >= self.args.requests:
                self.finish()
        else:
            self.errors += 1
            self.statuses[what] = self.statuses.get(what, 0) + 1
            if self.args.requests and self.done + self.errors >= self.args.requests:
                self.finish()

    def finish(self) -> None:
        self.sending = False
        if not self.finished.done():
            self.finished.set_result(None)


class Conn(asyncio.DatagramProtocol):
    """One QUIC connection: feeds datagrams to the stack, keeps its one timer, and sends a new
    request each time one ends, transmitting once per batch of events."""

    def __init__(self, load: Load) -> None:
        s = load.stack
        self.load = load
        cfg = s.QuicConfiguration(is_client=True, alpn_protocols=list(s.H3_ALPN))
        cfg.verify_mode = ssl.CERT_NONE
        cfg.server_name = "localhost"
        self.quic = s.QuicConnection(configuration=cfg)
        self.h3 = s.H3Connection(self.quic)
        self.transport: asyncio.DatagramTransport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at: float | None = None
        self.inflight = 0
        self.flushing = False  # a transmit is scheduled for the end of this loop pass
        self.bad: dict[int, bytes] = {}  # stream -> its non-2xx status, until the stream ends
        self.connected = load.loop.create_future()
        self.closed = False
        self.addr = (load.args.host, load.args.port)

    # asyncio side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.quic.connect(self.addr, now=self.load.loop.time())
        self.transmit()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.quic.receive_datagram(data, addr, now=self.load.loop.time())
        self.process()
        if not self.flushing:  # once after every datagram the loop has read in this pass
            self.flushing = True
            self.load.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flushing = False
        self.transmit()

    def error_received(self, exc: Exception) -> None:  # ICMP: nothing listens, say
        self.fail(f"socket error: {exc}")

    def on_timer(self) -> None:
        self.timer = self.timer_at = None
        self.quic.handle_timer(now=self.load.loop.time())
        self.process()
        self.transmit()

    # QUIC / HTTP/3 side
    def process(self) -> None:
        s, load = self.load.stack, self.load
        event = self.quic.next_event()
        while event is not None:
            if isinstance(event, s.StreamReset):
                if event.stream_id % 4 == 0:  # a request stream (client-initiated, bidi)
                    self.bad.pop(event.stream_id, None)
                    self.end(False, b"reset")
            elif isinstance(event, s.HandshakeCompleted):
                if not self.connected.done():
                    self.connected.set_result(None)
                self.fill()
            elif isinstance(event, s.ConnectionTerminated):
                self.closed = True
                if self.inflight and load.sending:
                    for _ in range(self.inflight):
                        load.ended(False, b"closed")
                self.inflight = 0
                if not self.connected.done():
                    self.connected.set_exception(ConnectionError(
                        f"connection closed: {event.error_code} {event.reason_phrase}"))
            for ev in self.h3.handle_event(event):
                if isinstance(ev, s.HeadersReceived) and ev.headers \
                        and ev.headers[0][0] == b":status":
                    status = ev.headers[0][1]
                    if not status.startswith((b"2", b"1")):  # 1xx: the response goes on
                        self.bad[ev.stream_id] = status
                if getattr(ev, "stream_ended", False):
                    if self.bad:
                        bad = self.bad.pop(ev.stream_id, None)
                        if bad is not None:
                            self.end(False, bad)
                            continue
                    self.end(True, b"")
            event = self.quic.next_event()

    def end(self, ok: bool, what: bytes) -> None:
        """A request ended (``ok``: with a 2xx): count it, and send the next in its place."""
        self.inflight -= 1
        self.load.ended(ok, what)
        if self.load.may_send():
            self.send()

    def fill(self) -> None:
        while self.inflight < self.load.args.streams and self.load.may_send():
            self.send()

    def send(self) -> None:
        sid = self.quic.get_next_available_stream_id()
        self.h3.send_headers(sid, self.load.fields, end_stream=True)
        self.inflight += 1

    def transmit(self) -> None:
        loop = self.load.loop
        if self.transport is None:
            return
        for data, _ in self.quic.datagrams_to_send(now=loop.time()):
            self.transport.sendto(data)
        at = self.quic.get_timer()
        if at != self.timer_at:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = loop.call_at(at, self.on_timer) if at is not None else None
            self.timer_at = at

    def fail(self, why: str) -> None:
        if not self.connected.done():
            self.connected.set_exception(ConnectionError(why))

    def close(self) -> None:
        if not self.closed:
            self.quic.close()
            self.closed = True
            self.transmit()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.close()


def pick_stack(name: str) -> str:
    """``name``, or for "auto" the first of STACKS that is installed."""
    if name != "auto":
        return name
    for stack in STACKS:
        if importlib.util.find_spec(stack) is not None:
            return stack
    raise SystemExit(f"h3load: none of {', '.join(STACKS)} is installed")


def load_stack(name: str) -> Any:
    """The QUIC + HTTP/3 classes of ``name`` (aioquic and its fork qh3 share the API)."""
    ns = argparse.Namespace()
    quic = importlib.import_module(f"{name}.quic.connection")
    config = importlib.import_module(f"{name}.quic.configuration")
    qev = importlib.import_module(f"{name}.quic.events")
    h3 = importlib.import_module(f"{name}.h3.connection")
    hev = importlib.import_module(f"{name}.h3.events")
    ns.QuicConnection, ns.QuicConfiguration = quic.QuicConnection, config.QuicConfiguration
    ns.H3Connection, ns.H3_ALPN = h3.H3Connection, h3.H3_ALPN
    ns.HandshakeCompleted, ns.ConnectionTerminated = qev.HandshakeCompleted, \
        qev.ConnectionTerminated
    ns.StreamReset = qev.StreamReset
    ns.HeadersReceived = hev.HeadersReceived
    return ns


def say(line: str) -> None:
    print(line, flush=True)


async def run(args: Args) -> int:
    loop = asyncio.get_running_loop()
    load = Load(args, loop, load_stack(args.stack))
    say(f"h3load: {args.stack} {importlib.metadata.version(args.stack)}, "
        f"{type(loop).__module__.partition('.')[0]} loop")
    try:
        for _ in range(args.clients):
            conn = Conn(load)
            await loop.create_datagram_endpoint(lambda c=conn: c,  # type: ignore[misc]
                                                remote_addr=(args.host, args.port))
            load.conns.append(conn)
        if args.warmup:
            say(WARMUP_STARTED)
        try:
            await asyncio.wait_for(asyncio.gather(*(c.connected for c in load.conns)),
                                   HANDSHAKE_TIMEOUT)
        except (TimeoutError, ConnectionError) as e:
            say(f"h3load: handshake failed: {type(e).__name__}: {e}")
            return 1
        if args.warmup:
            await asyncio.sleep(args.warmup)
        load.measuring = True
        load.unsent -= sum(c.inflight for c in load.conns)  # those in flight count too
        cpu0, t0 = time.process_time(), loop.time()
        say(MAIN_STARTED)
        with contextlib.suppress(TimeoutError):  # -D (or -T) is over
            await asyncio.wait_for(asyncio.shield(load.finished),
                                   min(args.duration or args.max_time, args.max_time))
        load.finish()
        load.measuring = False  # what ends after this is not counted
        cpu1, t1 = time.process_time(), loop.time()
        say(MAIN_OVER)
        for c in load.conns:
            c.close()
        await asyncio.sleep(CLOSE_GRACE)
    finally:
        for c in load.conns:
            c.stop()
    elapsed = max(1e-9, t1 - t0)
    cpu = cpu1 - cpu0
    statuses = ",".join(f"{k.decode(errors='replace')}:{v}" for k, v in
                        sorted(load.statuses.items()))
    say(f"h3load: requests={load.done} errors={load.errors} elapsed={elapsed:.3f} "
        f"rps={load.done / elapsed:.1f} cpu_us_per_req={cpu * 1e6 / max(1, load.done):.1f} "
        f"cpu_pct={100 * cpu / elapsed:.1f}" + (f" statuses={statuses}" if statuses else ""))
    short = args.requests and not args.duration and load.done + load.errors < args.requests
    if short:
        say(f"h3load: {args.requests - load.done - load.errors} of -n {args.requests} requests "
            f"not done within -T {args.max_time:g} s")
    return 0 if load.done and not load.errors and not short else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args = dataclasses.replace(args, stack=pick_stack(args.stack))
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run(args))
    return uvloop.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
