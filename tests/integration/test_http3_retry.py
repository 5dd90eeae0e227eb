"""A SIGTERM under steady HTTP/3 load, with a second instance to retry on: the clients do
what a real one does with the drain's signals (RFC 9114 §5.2), and no request fails.

Two lameduck processes, A and B, in front of one origin. Clients (aioquic's, tests/h3client.py)
keep requests going to A, each with a unique id, over connections they replace as a pool
does: after a GOAWAY no new stream opens on that connection (those below its identifier still
complete) and the next requests go on a new connection to A, while A accepts. A request A
says it did not process (reset with H3_REQUEST_REJECTED, §4.1.1, or at or above the last
GOAWAY's identifier when the connection ended) is sent again to B; so is one that could not
be sent because A's new connection said GOAWAY at once, or A stopped accepting connections
(at T) and left. Anything else that ends without a response may have been processed: it is
a failure, never retried.

A client that reads a GOAWAY opens nothing more, so a request lands past the final GOAWAY
only when the two cross on the wire: a client sent it before reading what was already on its
way. The load makes that happen at T now and then (a connection accepted just before T whose
first requests arrive after it); one more client makes it happen every time: it stalls (its
event loop blocked, as by a long pause) with an upload under way from before the drain until
A has passed T, then sends new requests on that connection before reading anything, as a
stalled client does."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lameduck.http3 import H3_REQUEST_REJECTED
from tests.h3client import H3Client, Reply, counted_active, h3_connect
from tests.integration.test_http3 import report_counts, started  # noqa: F401 (a fixture)
from tests.procs import Lameduck, Origin, wait_until

MIN_TO_A = 1000  # requests first sent to A
SIGTERM_AFTER = MIN_TO_A  # responses from A before A is told to stop: the load goes on to T
MAX_REQUESTS = 20_000  # the bound on the load, whatever happens
CLIENTS = 8  # each with its one connection to A at a time
DEPTH = 8  # requests open at once on a connection (A grants 100 streams)
CROSSING = 8  # requests the stalled client sends once A has passed T


@dataclass
class Request:
    """One request and what became of it: ``via`` the instance whose 200 it got, ``retried``
    why it went to B after A ("rejected": H3_REQUEST_REJECTED; "goaway": at or above the last
    GOAWAY when the connection ended; "unsent": A's new connection said GOAWAY at once, or A
    left before it could be sent; "idempotent": niquests failed it without saying why),
    ``failed`` how it ended otherwise."""

    n: int
    target: str = "/"
    via: str = ""
    retried: str = ""
    failed: str = ""

    @property
    def path(self) -> str:
        return f"{self.target}?id={self.n}"


def book(c: H3Client, rq: Request, sid: int, reply: Reply) -> bool:
    """Book A's answer to ``rq`` on stream ``sid``; True if it goes to B: A said it did not
    process it."""
    if reply.status == 200:
        rq.via = "A"
        return False
    if c.unprocessed(sid, reply):
        rq.retried = "rejected" if reply.reset == H3_REQUEST_REJECTED else "goaway"
        return True
    rq.failed = (f"A: status {reply.status} reset {reply.reset} closed {reply.closed} "
                 f"stream {sid} goaways {c.goaways()}")
    return False


async def on_b(b: H3Client, rq: Request) -> None:
    reply = await b.request("GET", rq.path)
    if reply.status == 200:
        rq.via = "B"
    else:
        rq.failed = f"B: status {reply.status} reset {reply.reset} closed {reply.closed}"


@dataclass
class Load:
    """The clients' shared state: the ids handed out, the outcomes, A's departure."""

    a: Lameduck
    b_addr: str
    requests: list[Request] = field(default_factory=list)
    to_a: int = 0
    ok_from_a: int = 0
    signalled: bool = False
    a_gone: asyncio.Event = field(default_factory=asyncio.Event)
    b: H3Client | None = None
    b_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(64))
    finishing: list[asyncio.Task[None]] = field(default_factory=list)
    conns: list[tuple[list[int], int | None]] = field(default_factory=list)

    def take(self) -> Request | None:
        """The next request to send to A, while A is there (and the load short of its bound);
        None once the load is done."""
        if len(self.requests) >= MAX_REQUESTS or (self.a_gone.is_set()
                                                  and self.to_a >= MIN_TO_A):
            return None
        rq = Request(len(self.requests))
        self.requests.append(rq)
        return rq

    def answered(self, c: H3Client, rq: Request, sid: int, reply: Reply) -> bool:
        """Book A's answer (``book``), and SIGTERM A after SIGTERM_AFTER 200s."""
        if book(c, rq, sid, reply):
            return True
        if rq.via == "A":
            self.ok_from_a += 1
            if self.ok_from_a >= SIGTERM_AFTER and not self.signalled:
                self.signalled = True
                self.a.signal(signal.SIGTERM)
        return False

    async def on_b(self, rq: Request) -> None:
        assert self.b is not None
        async with self.b_slots:
            await on_b(self.b, rq)

    async def connect_a(self, stack: contextlib.AsyncExitStack) -> H3Client | None:
        """A new connection to A, or None once A has left (after T it takes no new
        connection: its Initial packets go unanswered, so only A's exit ends the wait)."""
        connecting = asyncio.ensure_future(stack.enter_async_context(h3_connect(self.a.addr)))
        gone = asyncio.ensure_future(self.a_gone.wait())
        await asyncio.wait({connecting, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not connecting.done():
            connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            return await connecting
        return None

    async def client(self) -> None:
        """One client: a connection to A at a time, DEPTH requests open on it until it goes
        away; then the next connection, while the last one finishes on its own."""
        while True:
            rq = self.take()
            if rq is None:
                return
            stack = contextlib.AsyncExitStack()
            c = await self.connect_a(stack) if not self.a_gone.is_set() else None
            if c is None or c.went_away():  # A left, or said "go away" at once
                await stack.aclose()
                rq.retried = "unsent"
                await self.on_b(rq)
                continue
            open_: dict[asyncio.Future[Reply], tuple[Request, int]] = {}
            self.send_a(c, rq, open_)
            while open_:
                while len(open_) < DEPTH and not c.went_away():
                    nxt = self.take()
                    if nxt is None:
                        break
                    self.send_a(c, nxt, open_)
                if c.went_away():
                    break  # the rest finishes on its own; new requests go elsewhere
                done, _ = await asyncio.wait(open_, return_when=asyncio.FIRST_COMPLETED)
                for fut in done:
                    got, sid = open_.pop(fut)
                    if self.answered(c, got, sid, fut.result()):
                        await self.on_b(got)
            self.finishing.append(asyncio.create_task(self.finish(c, stack, open_)))

    def send_a(self, c: H3Client, rq: Request,
               open_: dict[asyncio.Future[Reply], tuple[Request, int]]) -> None:
        self.to_a += 1
        sid = c._quic.get_next_available_stream_id()
        open_[c.send("GET", rq.path)] = (rq, sid)

    async def finish(self, c: H3Client, stack: contextlib.AsyncExitStack,
                     open_: dict[asyncio.Future[Reply], tuple[Request, int]]) -> None:
        """A connection that went away: its open requests end (answered, or rejected and sent
        to B), then the client waits for A to close it, as one that keeps it would."""
        try:
            for fut, (rq, sid) in open_.items():
                if self.answered(c, rq, sid, await fut):
                    await self.on_b(rq)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(60):
                    await c.gone.wait()
            self.conns.append((c.goaways(), c.terminated.error_code
                               if c.terminated is not None else None))
        finally:
            await stack.aclose()

    async def run(self) -> None:
        async with h3_connect(self.b_addr) as b:
            self.b = b
            watch = asyncio.create_task(self.watch_a())
            try:
                await asyncio.gather(*(self.client() for _ in range(CLIENTS)))
                await asyncio.gather(*self.finishing)
            finally:
                watch.cancel()

    async def watch_a(self) -> None:
        await asyncio.to_thread(self.a.wait, 300)
        self.a_gone.set()


UPLOAD = (b"x" * 1000, b"y" * 1000)  # the stalled client's upload, before and after


def stalled_client(a: Lameduck, b_addr: str, upload: Request, late: list[Request],
                   ready: threading.Event, errors: list[BaseException]) -> None:
    """The client whose requests cross A's final GOAWAY, in a thread of its own (its own
    event loop): an upload to A begun before the load (a request in flight, so the drain
    keeps its connection open), then the stall from before the drain until A has passed T
    (its log says so), then ``late`` sent on that connection before anything is read. It
    read no GOAWAY, so it may open them; A had sent its final GOAWAY at T at the latest (below
    them), so each must come back H3_REQUEST_REJECTED, and goes to B. The upload, below the
    final GOAWAY, then ends and is answered by A."""

    async def go() -> None:
        async with h3_connect(a.addr) as c, h3_connect(b_addr) as b:
            sid, done = c.begin("POST", upload.path, body=UPLOAD[0])
            assert await counted_active(a, 60)
            ready.set()
            # the stall: this loop reads nothing until the requests below are sent
            assert wait_until(lambda: "drain time reached: no new work" in a.log(), 120)
            assert not c.went_away()
            sent = []
            for rq in late:
                s = c._quic.get_next_available_stream_id()
                sent.append((rq, s, c.send("GET", rq.path)))
            c.more(sid, UPLOAD[1], end=True)
            for rq, s, fut in sent:
                if book(c, rq, s, await fut):
                    await on_b(b, rq)
            reply = await done
            if reply.status == 200 and reply.body == b"".join(UPLOAD):
                upload.via = "A"
            else:
                upload.failed = f"upload: status {reply.status} reset {reply.reset}"

    try:
        asyncio.run(asyncio.wait_for(go(), 300))
    except BaseException as e:
        errors.append(e)
    finally:
        ready.set()


NIQUESTS_FROM = 100_000  # the ids of niquests' requests
NIQUESTS_MAX = 3000


def niquests_client(a: Lameduck, b: Lameduck, ca: str, out: list[Request],
                    errors: list[BaseException]) -> None:
    """An independent stack (niquests over qh3, HTTP/3 only) in a thread of its own: one GET
    at a time to A, until A has left. niquests honours GOAWAY (no new stream on that
    connection) and reports a rejection as a ProtocolError naming its code (0x10b,
    H3_REQUEST_REJECTED); but a connection that ended under a request, or one to A that could
    not be made after T, is a ProtocolError or a reset that does not say whether A processed
    the request (niquests keeps no GOAWAY identifier to tell). A GET is idempotent (RFC 9110
    §9.2.2), so such a client sends it again elsewhere; whether A had processed it is then
    the origin's log to say (each id seen once)."""
    import niquests

    try:
        with niquests.Session(disable_http1=True, disable_http2=True) as sa, \
                niquests.Session(disable_http1=True, disable_http2=True) as sb:
            sa.quic_cache_layer.add_domain("127.0.0.1", a.port)
            sb.quic_cache_layer.add_domain("127.0.0.1", b.port)
            while a.proc is not None and a.proc.poll() is None and len(out) < NIQUESTS_MAX:
                rq = Request(NIQUESTS_FROM + len(out))
                out.append(rq)
                try:
                    r = sa.get(f"https://127.0.0.1:{a.port}{rq.path}", verify=ca,
                               timeout=(30, 60))
                except niquests.exceptions.ConnectionError as e:
                    rq.retried = "rejected" if "0x10b" in str(e) else "idempotent"
                else:
                    if r.status_code == 200:
                        rq.via = "A"
                    else:
                        rq.failed = f"A (niquests): status {r.status_code}"
                    continue
                r = sb.get(f"https://127.0.0.1:{b.port}{rq.path}", verify=ca, timeout=60)
                if r.status_code == 200:
                    rq.via = "B"
                else:
                    rq.failed = f"B (niquests): status {r.status_code}"
    except BaseException as e:
        errors.append(e)


ID = re.compile(r"[?&]id=(\d+)")


def ids_in(lines: list[str]) -> Counter[int]:
    return Counter(int(m.group(1)) for line in lines if (m := ID.search(line)))


def test_sigterm_under_http3_load_retries_on_a_second_instance(
        started: Callable[..., Lameduck], origins: Callable[..., list[Origin]],  # noqa: F811
        tmp_path: Path, tls_files: tuple[Path, Path, Path]) -> None:
    """>= 1,000 requests to A (aioquic's clients, and niquests beside them), SIGTERM
    part-way: every request is answered 200, by A or, after A said it did not process it (or
    A left first), by B; the stalled client's requests were rejected and retried, every run;
    no retried request reached the origin through A (the origin saw each id once, A's access
    log shows it forwarded only those it answered); A exits 0 with nothing cut."""
    origin, = origins(1, log=True)
    a_log, b_log = tmp_path / "a-access.log", tmp_path / "b-access.log"
    a = started(origin.port, listener={"access_log": {"path": str(a_log)}},
                drain={"time": "4s", "strategy": "gradual", "connection_grace": "500ms"},
                shutdown={"deadline": "60s", "min_drain": "4s"},
                hot_restart={"parent_shutdown_time": "60s"})
    b = started(origin.port, listener={"access_log": {"path": str(b_log)}})
    load = Load(a, b.addr)
    upload = Request(0, target="/echo")
    late = [Request(n) for n in range(1, CROSSING + 1)]
    load.requests += [upload, *late]
    ready = threading.Event()
    errors: list[BaseException] = []
    stalled = threading.Thread(target=stalled_client,
                               args=(a, b.addr, upload, late, ready, errors))
    niq: list[Request] = []
    niq_thread = threading.Thread(target=niquests_client,
                                  args=(a, b, str(tls_files[0]), niq, errors))
    stalled.start()
    try:
        assert ready.wait(120)
        if not errors:
            niq_thread.start()
            asyncio.run(asyncio.wait_for(load.run(), 300))
    finally:
        stalled.join(300)
        if niq_thread.ident is not None:
            niq_thread.join(300)
    assert not stalled.is_alive() and not niq_thread.is_alive()
    if errors:
        raise errors[0]

    assert a.wait(60) == 0, a.log()
    rqs = load.requests + niq
    failed = [(r.n, r.failed) for r in rqs if r.failed or r.via not in ("A", "B")]
    assert not failed, (len(failed), failed[:10])
    assert load.to_a >= MIN_TO_A, load.to_a
    retried = [r for r in rqs if r.retried]
    rejected = [r for r in retried if r.retried == "rejected"]
    assert rejected, (Counter(r.retried for r in retried), load.conns[-20:])
    assert [r.retried for r in late] == ["rejected"] * CROSSING, [vars(r) for r in late]
    assert upload.via == "A", vars(upload)
    assert all(r.via == "B" for r in retried)
    # processed once: the origin saw every id exactly once, a retried one through B only
    seen = ids_in(origin.log_lines())
    assert sorted(seen) == sorted(r.n for r in rqs), (len(seen), len(rqs))
    assert set(seen.values()) == {1}, [n for n, k in seen.items() if k > 1][:10]
    # and A's access log: it forwarded exactly those it answered (upstream host not "-")
    a_forwarded = set(ids_in([ln for ln in a_log.read_text().splitlines()
                              if not ln.endswith('"-"')]))
    assert a_forwarded == {r.n for r in rqs if r.via == "A"}, \
        sorted(a_forwarded ^ {r.n for r in rqs if r.via == "A"})[:10]
    completed, refused, cut, _, _ = report_counts(a)
    assert cut == 0, a.log()
    print(f"requests {len(rqs)} (aioquic to A {load.to_a} + {CROSSING + 1}, niquests "
          f"{len(niq)}), retried on B: aioquic "
          f"{dict(Counter(r.retried for r in load.requests if r.retried))}, niquests "
          f"{dict(Counter(r.retried for r in niq if r.retried))}; A's drain report: "
          f"completed={completed} refused={refused} cut={cut}")
