"""An idle HTTP/1.1 keep-alive connection holds no request parser: it gives its reader (the
llhttp parser and the callbacks bound to it) back when its last exchange ends, and takes one when
its next bytes come. Played on the real H1Downstream with no sockets (tests/playbook.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lameduck.http1 import downstream
from lameduck.http1.downstream import READERS, H1Downstream, Reader
from tests import playbook
from tests.playbook import Transport

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.fixture(autouse=True)
def empty_pool() -> Iterator[None]:
    """The pool is the process's: each case starts (and leaves it) empty."""
    READERS.top = None
    READERS.count = 0
    yield
    READERS.top = None
    READERS.count = 0


def pooled() -> list[Reader]:
    out = []
    rd = READERS.top
    for _ in range(READERS.count):
        assert rd is not None
        out.append(rd)
        rd = rd.next
    return out


class Client:
    """One accepted connection and the upstreams its requests went to."""

    def __init__(self, ls: playbook.Listener) -> None:
        self.ls = ls
        self.answered: list[bytes] = []  # the targets of the requests answered, in order
        self.conn = H1Downstream(ls)
        self.t = Transport(ls.loop)
        self.conn.connection_made(self.t)

    def send(self, data: bytes) -> None:
        self.conn.data_received(data)

    def answer(self, body: bytes = b"ok") -> bytes:
        """The upstream answers the request at the head of the queue; what the client got."""
        up = self.conn.queue[0].up
        if up is None:  # its upstream connection is still being made
            up = next(c for c in self.ls.connects if c.conn is None).succeed()
        self.answered.append(up.head.path)
        up.sink.on_response_head(200, [(b"Content-Length", b"%d" % len(body))], len(body), False)
        up.sink.on_response_body(body)
        up.sink.on_response_complete()
        return self.t.take()


def test_an_idle_connection_gives_its_reader_back_and_takes_one_for_its_next_request() -> None:
    ls = playbook.Listener()
    a = Client(ls)
    assert a.conn.rd is None  # accepted: nothing read yet
    a.send(b"GET /1 HTTP/1.1\r\nHost: app\r\n\r\n")
    rd = a.conn.rd
    assert rd is not None and rd.conn is a.conn  # held while the request is in flight
    assert a.answer() == OK
    assert a.conn.rd is None and rd.conn is None and pooled() == [rd]
    # its next request takes the pooled reader and is parsed as any other
    a.send(b"GET /2 HTTP/1.1\r\nHost: app\r\nContent-Length: 3\r\n\r\nabc")
    assert a.conn.rd is rd and rd.conn is a.conn and pooled() == []
    assert a.answer() == OK
    assert a.answered == [b"/1", b"/2"]
    assert pooled() == [rd]


def test_a_reader_given_back_by_one_connection_parses_the_next_request_of_another() -> None:
    ls = playbook.Listener()
    a, b = Client(ls), Client(ls)
    a.send(b"GET /a1 HTTP/1.1\r\nHost: app\r\n\r\n")
    b.send(b"GET /b1 HTTP/1.1\r\nHost: app\r\n\r\n")
    ra, rb = a.conn.rd, b.conn.rd
    assert ra is not None and rb is not None and ra is not rb
    a.answer()
    b.answer()
    assert pooled() == [rb, ra]  # the last given back is taken first
    a.send(b"GET /a2 HTTP/1.1\r\nHost: app\r\n\r\n")
    assert a.conn.rd is rb and rb.conn is a.conn
    b.send(b"GET /b2 HTTP/1.1\r\nHost: app\r\n\r\n")
    assert b.conn.rd is ra and ra.conn is b.conn
    assert a.answer() == OK and b.answer() == OK
    assert a.answered == [b"/a1", b"/a2"] and b.answered == [b"/b1", b"/b2"]


def test_pipelined_requests_keep_the_reader_until_the_last_is_answered() -> None:
    ls = playbook.Listener()
    a = Client(ls)
    a.send(b"GET /1 HTTP/1.1\r\nHost: app\r\n\r\nGET /2 HTTP/1.1\r\nHost: app\r\n\r\n"
           b"GET /3 HTTP/1.1\r\nHo")  # the third's head ends in the next read
    rd = a.conn.rd
    assert rd is not None
    assert a.answer() == OK
    assert a.answer() == OK
    assert a.conn.rd is rd and pooled() == []  # the third request has begun: still held
    a.send(b"st: app\r\n\r\n")
    assert a.answer() == OK
    assert a.answered == [b"/1", b"/2", b"/3"]
    assert a.conn.rd is None and pooled() == [rd]
    # the next pipelined pair after idling, on the reader it took back
    a.send(b"GET /4 HTTP/1.1\r\nHost: app\r\n\r\nGET /5 HTTP/1.1\r\nHost: app\r\n\r\n")
    assert a.conn.rd is rd
    assert a.answer() == OK and a.answer() == OK
    assert a.answered[3:] == [b"/4", b"/5"]
    assert pooled() == [rd]


def test_a_request_answered_within_its_read_gives_the_reader_back_after_the_read() -> None:
    ls = playbook.Listener()
    a = Client(ls)
    a.send(b"GET /healthz HTTP/1.1\r\nHost: app\r\n\r\n")  # answered here, inside the parser
    assert a.t.take().startswith(b"HTTP/1.1 200 ")
    assert a.conn.rd is None and len(pooled()) == 1


def test_a_first_request_gets_a_new_reader_so_http09_is_still_told_apart() -> None:
    """llhttp keeps the last version it parsed: a pooled reader would take ``GET /`` (no
    version) for the version before it. A connection's first request is read by a new one."""
    ls = playbook.Listener()
    a = Client(ls)
    a.send(b"GET /1 HTTP/1.1\r\nHost: app\r\n\r\n")
    a.answer()
    assert len(pooled()) == 1
    b = Client(ls)
    b.send(b"GET /\r\n")
    assert b.t.take().startswith(b"HTTP/1.1 400 ")
    assert len(pooled()) == 1  # not taken
    rd = b.conn.rd
    assert rd is not None  # held by the closing connection (it saw an error), not given back
    b.t.close()
    b.conn.connection_lost(None)
    assert b.conn.rd is None and rd.conn is None and len(pooled()) == 1


def test_a_connection_that_reads_no_more_does_not_give_its_reader_back() -> None:
    """llhttp refuses bytes after a message that ends its connection (and a cut one is not at a
    message boundary): such a reader is dropped, not pooled."""
    ls = playbook.Listener()
    a = Client(ls)
    a.send(b"GET /1 HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n")
    assert a.answer().endswith(b"ok")
    assert pooled() == []
    b = Client(ls)
    b.send(b"POST /1 HTTP/1.1\r\nHost: app\r\nContent-Length: 10\r\n\r\nabc")
    rd = b.conn.rd
    assert rd is not None
    b.t.close()
    b.conn.connection_lost(None)
    assert b.conn.rd is None and rd.conn is None and pooled() == []


def test_the_pool_keeps_at_most_kept_readers() -> None:
    ls = playbook.Listener()
    clients = [Client(ls) for _ in range(downstream.READERS_KEPT + 3)]
    for c in clients:
        c.send(b"GET / HTTP/1.1\r\nHost: app\r\n\r\n")
    for c in clients:
        c.answer()
    assert all(c.conn.rd is None for c in clients)
    assert READERS.count == downstream.READERS_KEPT == len(pooled())
