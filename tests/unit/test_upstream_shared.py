"""upstream/shared.py on fake connections, no sockets: where a new stream goes (Placement), and
when a stream handed out is sent, waits or is refused (SharedConn's slots).

The fake connection plays the frame layer's part as HTTP/2 does: a stream may open while the
wire is open, no GOAWAY came and fewer than the upstream's SETTINGS_MAX_CONCURRENT_STREAMS are
open (RFC 9113 §5.1.2; before its first SETTINGS, the default of no limit, §6.5.2)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from lameduck.drain.endpoint import EndpointDrain
from lameduck.upstream.connector import UpstreamConn
from lameduck.upstream.pool import Endpoint
from lameduck.upstream.shared import QUEUED, REFUSE, SEND, Placement, SharedConn


class FakeStream(UpstreamConn):
    """A stream as the codec's: sent (opens on the wire) or refused (ends, never sent)."""

    def __init__(self, conn: FakeConn) -> None:
        super().__init__(multiplexed=True)
        self.conn = conn
        self.state = "handed out"

    @property
    def reusable(self) -> bool:
        return False

    def go(self) -> int:
        """Its request is ready: what the connection decided, acted on as the codec does."""
        how = self.conn.start(self)
        if how == SEND:
            self.send_head()
        elif how == REFUSE:
            self.refuse()
        else:
            self.state = "queued"
        return how

    def send_head(self) -> None:
        self.state = "sent"
        self.conn.open_streams.append(self)

    def refuse(self) -> None:
        self.state = "refused"
        self.conn.leave(self)
        self.conn.stream_gone()

    def ended(self) -> None:
        """Its response is complete (or it was reset): the slot is free."""
        self.state = "ended"
        self.conn.open_streams.remove(self)
        self.conn.stream_gone()


class FakeConn(SharedConn):
    def __init__(self, max_streams: int = 100, expected: int = 100) -> None:
        super().__init__(max_streams, expected)
        self.open_streams: list[FakeStream] = []
        self.wire_closed = False
        self.wire_goaway = False
        self.closed = 0
        self.clock = 0.0
        self.peer_settings = -1  # the upstream's MAX_CONCURRENT_STREAMS; -1: no SETTINGS yet

    def settings(self, max_concurrent: int) -> None:
        """The upstream's SETTINGS came, then what the codec does after a read."""
        self.peer_settings = max_concurrent
        self.start_waiting()

    def peer_limit(self) -> int:
        return self.peer_settings

    def wire_can_open(self) -> bool:
        peer = self.peer_settings if self.peer_settings >= 0 else 1 << 31
        return not self.wire_closed and not self.wire_goaway and len(self.open_streams) < peer

    def on_wire(self) -> int:
        return len(self.open_streams)

    def new_stream(self) -> FakeStream:
        return FakeStream(self)

    def now(self) -> float:
        return self.clock

    def close(self) -> None:
        self.closed += 1
        self.alive = False
        self.wire_closed = True


def streams(conn: FakeConn, n: int) -> list[FakeStream]:
    out = []
    for _ in range(n):
        s = conn.take()
        assert isinstance(s, FakeStream)
        out.append(s)
    return out


# -- a connection's slots ----------------------------------------------------------------------

def test_one_stream_at_a_time_until_the_settings_then_up_to_their_limit() -> None:
    """Before the upstream's SETTINGS its limit is unknown: a second stream waits rather than
    risk a refusal; SETTINGS(3) sends what waited up to 3, the rest when streams end."""
    conn = FakeConn(max_streams=10, expected=10)
    s = streams(conn, 5)
    assert [x.go() for x in s] == [SEND, QUEUED, QUEUED, QUEUED, QUEUED]
    assert conn.busy == 5 and conn.reserved == 0
    conn.settings(3)
    assert [x.state for x in s] == ["sent", "sent", "sent", "queued", "queued"]
    s[0].ended()
    assert s[3].state == "sent" and s[4].state == "queued"
    s[1].ended()
    assert s[4].state == "sent" and not conn.waiting


def test_can_take_counts_streams_handed_out_and_waiting_against_the_limit() -> None:
    conn = FakeConn(max_streams=4, expected=2)
    assert conn.limit == 2  # the endpoint's last SETTINGS said 2
    a, b = streams(conn, 2)
    assert not conn.can_take  # two handed out, not started: still the limit's
    a.go()
    assert not conn.can_take
    conn.settings(10)
    assert conn.limit == 4  # ours is lower
    assert conn.can_take
    b.go()
    assert conn.busy == 2


def test_settings_lowering_the_limit_queues_streams_until_enough_end() -> None:
    """The upstream lowered MAX_CONCURRENT_STREAMS from 3 to 1 with three streams open: a
    stream handed out before it waits until two... three have ended (RFC 9113 §5.1.2: the
    streams over the new limit may finish)."""
    conn = FakeConn(max_streams=10)
    conn.settings(3)
    s = streams(conn, 4)
    assert [x.go() for x in s[:3]] == [SEND] * 3
    conn.settings(1)
    assert not conn.can_take and conn.limit == 1
    assert s[3].go() == QUEUED
    s[0].ended()
    s[1].ended()
    assert s[3].state == "queued"  # one still open: at the limit
    s[2].ended()
    assert s[3].state == "sent"


def test_max_concurrent_streams_0_refuses_what_is_started_and_what_waited() -> None:
    conn = FakeConn()
    a, b, c = streams(conn, 3)
    assert a.go() == SEND and b.go() == QUEUED  # no SETTINGS yet: one at a time
    conn.settings(0)
    assert b.state == "refused" and not conn.waiting
    assert c.go() == REFUSE and c.state == "refused"
    assert conn.allows_none and not conn.can_take


def test_goaway_refuses_waiting_and_started_streams_and_closes_once_idle() -> None:
    conn = FakeConn()
    a, b, c = streams(conn, 3)
    assert a.go() == SEND and b.go() == QUEUED
    conn.goaway = True  # what the codec does on GOAWAY, then:
    conn.wire_goaway = True
    conn.refuse_waiting()
    assert b.state == "refused" and conn.closed == 0  # a and c are still its
    assert c.go() == REFUSE  # handed out before the GOAWAY: never sent, refused
    assert conn.closed == 0 and not conn.can_take
    conn.clock = 7.0
    a.ended()
    assert conn.closed == 1 and conn.idle_since == 7.0


def test_a_stream_let_go_before_it_started_gives_its_slot_back() -> None:
    conn = FakeConn(max_streams=1)
    streams(conn, 1)
    assert not conn.can_take
    conn.give_back()
    conn.stream_gone()
    assert conn.busy == 0 and conn.can_take and conn.closed == 0


def test_a_waiting_stream_that_gives_up_leaves_the_queue() -> None:
    conn = FakeConn()
    a, b, c = streams(conn, 3)
    a.go(), b.go(), c.go()
    assert list(conn.waiting) == [b, c]
    conn.leave(b)  # cut, or its client gone
    conn.stream_gone()
    conn.leave(b)  # twice is harmless
    assert list(conn.waiting) == [c] and conn.busy == 2
    conn.settings(5)
    assert c.state == "sent"


def test_the_idle_clock_starts_when_the_last_stream_ends() -> None:
    conn = FakeConn()
    conn.settings(5)
    a, b = streams(conn, 2)
    a.go(), b.go()
    conn.clock = 1.0
    a.ended()
    assert conn.idle_since == 0.0
    conn.clock = 2.0
    b.ended()
    assert conn.idle_since == 2.0 and conn.closed == 0  # kept open: idle_timeout closes it


# -- placement ---------------------------------------------------------------------------------

class FakeOpener(Placement):
    """Connections open when the test says (``finish``), with what it says."""

    def __init__(self, max_streams: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(max_streams, loop)
        self.opens: list[tuple[Endpoint, int, asyncio.Future[SharedConn]]] = []

    async def open(self, ep: Endpoint, expected: int) -> SharedConn:
        fut: asyncio.Future[SharedConn] = self.loop.create_future()
        self.opens.append((ep, expected, fut))
        return await fut

    def finish(self, i: int, settings: int | None = None) -> FakeConn:
        _, expected, fut = self.opens[i]
        conn = FakeConn(self.max_streams, expected)
        if settings is not None:
            conn.peer_settings = settings
        fut.set_result(conn)
        return conn


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def settle(loop: asyncio.AbstractEventLoop) -> None:
    """Run what is ready: the opens started, the done callbacks of those finished."""
    for _ in range(5):
        loop.run_until_complete(asyncio.sleep(0))


def endpoint(max_connecting: int = 0) -> Endpoint:
    return Endpoint("127.0.0.1", 1, 4, 1, EndpointDrain(), max_connecting=max_connecting)


def test_placement_order_shared_with_room_then_opening_then_a_new_connection(loop) -> None:
    ep = endpoint()
    pool = FakeOpener(2, loop)
    full = FakeConn(2, 2)
    full.settings(2)
    streams(full, 2)
    roomy = FakeConn(2, 2)
    roomy.settings(2)
    ep.shared.extend([full, roomy])
    f1 = pool.connect(ep)
    assert f1.result().conn is roomy  # type: ignore[attr-defined]
    f2 = pool.connect(ep)
    assert f2.result().conn is roomy  # type: ignore[attr-defined]
    f3 = pool.connect(ep)  # both full: a new connection, f3 promised on it
    f4 = pool.connect(ep)  # room for 2 on it (the endpoint's SETTINGS said 2)
    f5 = pool.connect(ep)  # full too: another
    settle(loop)
    assert len(pool.opens) == 2 and not f3.done()
    assert [len(w) for _, w in pool.opening[ep]] == [2, 1]
    first = pool.finish(0)
    settle(loop)
    assert f3.result().conn is first and f4.result().conn is first  # type: ignore[attr-defined]
    assert not f5.done() and ep.shared[-1] is first and first.reserved == 2
    assert list(pool.opening) == [ep] and len(pool.opening[ep]) == 1
    second = pool.finish(1)
    settle(loop)
    assert f5.result().conn is second and ep not in pool.opening  # type: ignore[attr-defined]


def test_a_connection_being_opened_takes_up_to_the_learned_limit(loop) -> None:
    """The endpoint's connections said SETTINGS_MAX_CONCURRENT_STREAMS 3 (ours 100): a new
    connection is expected to take 3, and is told so before its own SETTINGS come."""
    ep = endpoint()
    pool = FakeOpener(100, loop)
    said = FakeConn(100, 100)
    said.settings(3)
    streams(said, 3)
    ep.shared.append(said)
    futs = [pool.connect(ep) for _ in range(7)]
    settle(loop)
    assert pool.learned[ep] == 3
    assert [len(w) for _, w in pool.opening[ep]] == [3, 3, 1]
    assert [expected for _, expected, _ in pool.opens] == [3, 3, 3]
    conn = pool.finish(0)
    settle(loop)
    assert conn.limit == 3 and conn.busy == 3 and not conn.can_take
    assert all(f.done() for f in futs[:3]) and not any(f.done() for f in futs[3:])


def test_an_upstream_that_allows_no_stream_gets_the_stream_to_refuse(loop) -> None:
    """MAX_CONCURRENT_STREAMS 0: the stream goes there to be refused (the exchange answers
    503 or tries elsewhere), no connection is opened for it; a later connection expects 1."""
    ep = endpoint()
    pool = FakeOpener(100, loop)
    none = FakeConn()
    none.settings(0)
    ep.shared.append(none)
    f = pool.connect(ep)
    s = f.result()
    assert isinstance(s, FakeStream) and s.conn is none and s.go() == REFUSE
    none.goaway = True
    pool.connect(ep)
    settle(loop)
    assert [expected for _, expected, _ in pool.opens] == [1]


def test_max_connecting_puts_the_rest_in_the_endpoints_line(loop) -> None:
    """One stream per connection and max_connecting 1: a burst of three opens one connection;
    the others wait in the endpoint's line (where HTTP/1.1 requests wait) and each open that
    ends places them again, in order."""
    ep = endpoint(max_connecting=1)
    pool = FakeOpener(1, loop)
    a, b, c = (pool.connect(ep) for _ in range(3))
    settle(loop)
    assert len(pool.opens) == 1 and len(ep.waiting) == 2
    pool.finish(0, settings=1)
    settle(loop)
    assert a.done() and not b.done()
    assert len(pool.opens) == 2 and len(ep.waiting) == 1  # b's open, c in line again
    pool.finish(1, settings=1)
    settle(loop)
    assert b.done() and len(pool.opens) == 3 and not ep.waiting
    pool.finish(2, settings=1)
    settle(loop)
    assert c.done() and len(ep.shared) == 3


def test_a_connection_that_fails_to_open_fails_all_its_waiters_and_wakes_the_line(loop) -> None:
    ep = endpoint(max_connecting=1)
    pool = FakeOpener(2, loop)
    futs = [pool.connect(ep) for _ in range(3)]  # two promised on the open, one in line
    settle(loop)
    assert [len(w) for _, w in pool.opening[ep]] == [2] and len(ep.waiting) == 1
    pool.opens[0][2].set_exception(ConnectionRefusedError())
    settle(loop)
    assert all(isinstance(f.exception(), ConnectionRefusedError) for f in futs[:2])
    assert not futs[2].done() and len(pool.opens) == 2  # the one in line opens its own
    assert not ep.shared


def test_a_waiter_that_gave_up_takes_no_stream(loop) -> None:
    """A request that ended (timed out, its client gone) while its connection was being
    opened, or while in line: nothing is reserved for it, nothing opened for it."""
    ep = endpoint(max_connecting=1)
    pool = FakeOpener(1, loop)
    a, b = pool.connect(ep), pool.connect(ep)
    settle(loop)
    a.cancel()
    b.cancel()
    conn = pool.finish(0, settings=1)
    settle(loop)
    assert conn.busy == 0 and conn.can_take and ep.shared == [conn]
    assert len(pool.opens) == 1 and not ep.waiting


def test_a_connection_lost_before_it_was_shared_is_not_shared(loop) -> None:
    ep = endpoint()
    pool = FakeOpener(2, loop)
    f = pool.connect(ep)
    settle(loop)
    _, expected, fut = pool.opens[0]
    conn = FakeConn(2, expected)
    conn.alive = False  # lost between the connect and its done-callback
    fut.set_result(conn)
    settle(loop)
    assert not ep.shared
    s = f.result()
    assert isinstance(s, FakeStream) and s.go() == REFUSE
