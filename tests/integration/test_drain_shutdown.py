"""SIGTERM / SIGINT lifecycle over real sockets, as the usual graceful-draining recipe has it:
not ready first, then one drain event, then exit on completion or at the deadline, where what
is left is cut (503 before any response byte, a reset after) and counted.

Margins are seconds, so that they hold on a loaded 2-core machine (and with two workers, which
learn of a drain by a message from the main process that comes late there): T and the
deadline are seconds away from every step a test takes before them, a request meant to finish
ends seconds before the deadline, one meant to be cut lasts far longer than it, and the tests
wait on the server's own state (stats, ``/server_info``, its drain clock) rather than a client's
sleep. Lower bounds follow from the code's own timers (the server's clock starts after the
test's ``t0``); upper bounds are far from the moment they tell apart (the deadline, T). The
exact moments belong to the fake-clock tests (tests/unit/test_drain_process.py,
tests/unit/test_downstream_playbook.py).
"""

from __future__ import annotations

import re
import signal
import socket
import threading
import time

import httpx
import pytest

from tests.procs import AdminPoller, Lameduck, RawConn, refused, wait_until

pytestmark = pytest.mark.usefixtures("workers")


class ExitWatch:
    """Records the moment the process exits (proc.wait in a thread), for exit-time bounds."""

    def __init__(self, ld: Lameduck) -> None:
        self.ld = ld
        self.at: float | None = None
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        assert self.ld.proc is not None
        self.code = self.ld.proc.wait()
        self.at = time.monotonic()

    def wait(self, timeout: float) -> int:
        self.thread.join(timeout)
        assert self.code is not None, f"lameduck did not exit within {timeout}s:\n{self.ld.log()}"
        return self.code


def ready_status(ld: Lameduck) -> int:
    try:
        return ld.admin("GET", "/ready").status_code
    except httpx.HTTPError:
        return -1


# A response that streams for 60 s (1200 chunks of 16 bytes, one every 50 ms): far longer
# than any deadline here, so the deadline cuts it.
STREAM = "/stream?chunks=1200&size=16&interval_ms=50"
STREAM_BYTES = 1200 * 16


def drain_report(log: str) -> str:
    lines = [ln for ln in log.splitlines() if "drain report:" in ln]
    assert len(lines) == 1, log
    return lines[0]



# -- the graceful-draining recipe: quick ones finish, the slow one is cut ---------------------


def test_quick_finish_slow_cut_idle_keepalive_going_away(lameduck) -> None:
    """T=0 immediate, deadline 6 s: two quick requests (3 s) finish with ``Connection: close``,
    the slow one (120 s) is cut with a 503 at the deadline, a new request on an idle keep-alive
    connection is refused with "going away", and the process exits after the deadline with exit
    code 3. The exact moments (refused at once, cut at the deadline) are
    tests/unit/test_drain_process.py's TestGracefulDrainRecipe, on a fake clock.

    A worker learns of the drain by a message from the main process, which on a loaded machine
    comes late: the quick requests last 3 s so that they are still in flight when every worker
    has heard (their responses then say ``Connection: close``), and the idle connection is tried
    only once every worker has (each stops accepting then: T = 0)."""
    deadline = 6.0
    ld = lameduck(drain={"time": "0s", "strategy": "immediate"},
                  shutdown={"deadline": f"{deadline:g}s"})
    idle = RawConn(ld.addr, timeout=30)
    first = idle.request("/")
    assert first.status == 200 and not first.closes

    admin = AdminPoller(ld.admin_addr)
    slow = RawConn(ld.addr, timeout=30)
    slow.send("/sleep?ms=120000")
    assert wait_until(lambda: admin.stat("http.ingress.downstream_rq_active") == 1, 15)
    quick = [RawConn(ld.addr, timeout=30), RawConn(ld.addr, timeout=30)]
    quick[0].send("/sleep?ms=3000")
    quick[1].send("/sleep?ms=3200")
    # All three in flight at SIGTERM (the quick ones for 3 s more).
    assert wait_until(lambda: admin.stat("http.ingress.downstream_rq_active") == 3, 15, 0)

    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    # Not ready at once; every worker stops accepting as it hears of the drain (T = 0).
    assert wait_until(lambda: admin.conn.request("/ready").status == 503, 15)
    assert wait_until(lambda: not ld.server_info()["listeners"][0]["accepting"], 15)
    # Then the idle keep-alive connection's next request is refused (the deadline, 6 s after
    # the signal, is far: until then the connection is open).
    gone = idle.request("/")
    assert gone.status == 503
    assert gone.closes
    assert gone.header("retry-after") is not None
    assert gone.body == b"going away\n"
    assert idle.wait_eof(10)
    # The quick ones finish (with Connection: close: with T=0 every response drains).
    for q, ms in zip(quick, (3000, 3200), strict=True):
        r = q.read_response()
        assert (r.status, r.body, r.complete) == (200, b"slept %d ms\n" % ms, True)
        assert r.closes
    # The slow one is cut at the deadline: no response byte was sent, so it gets a 503.
    cut = slow.read_response()
    cut_at = time.monotonic() - t0
    assert cut.status == 503 and cut.closes
    assert cut_at >= deadline - 0.05, cut_at  # the server's deadline runs from after t0
    assert slow.wait_eof(10)

    code = watch.wait(30)
    assert watch.at is not None
    took = watch.at - t0
    assert deadline - 0.05 <= took < deadline + 15, took
    assert code == 3  # it cut
    report = drain_report(ld.log())
    assert "cut=1 (503=1 reset=0)" in report
    assert "refused=1" in report
    for c in (idle, slow, *quick, admin):
        c.close()


# -- SIGTERM: not ready first, keep serving, clean exit ---------------------------------------


def test_sigterm_not_ready_health_check_503_in_flight_completes_exit_0(lameduck) -> None:
    """T = 4 s (min_drain T: serving until T, as when unset), deadline 20 s; a request of 5 s
    in flight at the signal. Before T the health-check path answers 503 and new traffic is
    served; the request finishes after T with ``Connection: close`` (past T/2 every response
    drains) and the process exits 0 once it is done, before the deadline. The exact moments
    (stop at T, exit when the last request ends) are tests/unit/test_drain_process.py's."""
    t, deadline, slow_ms = 4.0, 20.0, 5000
    ld = lameduck(listener={"health_check_path": "/health_check.html"},
                  drain={"time": f"{t:g}s", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": f"{deadline:g}s", "min_drain": f"{t:g}s",
                            "stop_accepting": "at_drain_end"})
    hc = httpx.get(ld.url("/health_check.html"))
    assert (hc.status_code, hc.text) == (200, "OK\n")
    slow = RawConn(ld.addr, timeout=30)
    sent = time.monotonic()
    slow.send(f"/sleep?ms={slow_ms}")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1, 15)

    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    assert wait_until(lambda: ready_status(ld) == 503, 15)
    # Before T (4 s: new connections are refused from then on, so both of these would fail
    # after it): the listener's own health-check path turns 503, through curl like a load
    # balancer, while traffic is still served.
    assert _curl_status(ld.url("/health_check.html")) == "503"
    r = httpx.get(ld.url("/"))
    assert r.status_code == 200
    ready = ld.admin("GET", "/ready")
    assert (ready.status_code, ready.text) == (503, "DRAINING\n")
    assert ld.server_info()["state"] == "DRAINING"

    done = slow.read_response()
    assert (done.status, done.body, done.complete) == (
        200, b"slept %d ms\n" % slow_ms, True)
    assert done.closes  # after T/2 every response drains its connection
    slow.close()
    assert watch.wait(30) == 0  # nothing was cut
    assert watch.at is not None
    # It exits once the last request is done and T has passed, before the deadline.
    assert watch.at - sent >= slow_ms / 1000 - 0.05
    assert t - 0.05 <= watch.at - t0 < deadline, watch.at - t0
    log = ld.log()
    report = drain_report(log)
    assert "cut=0" in report
    # One log line per phase.
    for phase in ("drain started (shutdown)", "SIGTERM: drain, then exit: not ready",
                  "listener ingress stopped accepting", "drain time reached: no new work",
                  "drain complete: no request in flight", "drain report:"):
        assert len(re.findall(re.escape(phase), log)) == 1, (phase, log)
    assert "cutting" not in log


def _curl_status(url: str) -> str:
    import subprocess

    return subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", url],
        capture_output=True, text=True, check=False).stdout.strip()


@pytest.mark.parametrize("stop_accepting", ["immediately", "at_drain_end"])
def test_stop_accepting(lameduck, stop_accepting: str) -> None:
    """``immediately`` refuses new connections at once; ``at_drain_end`` accepts until T (3 s).
    "At once" is "before T by the server's own drain clock"; the exact moments are
    tests/unit/test_drain_process.py's (stop at T, stop immediately). min_drain T holds the
    process until T whenever the busy request (4 s) ends."""
    t = 3.0
    ld = lameduck(drain={"time": f"{t:g}s", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "20s", "min_drain": f"{t:g}s",
                            "stop_accepting": stop_accepting})
    busy = RawConn(ld.addr, timeout=30)  # keeps the process alive past T
    busy.send("/sleep?ms=4000")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1, 15)
    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    assert wait_until(lambda: ready_status(ld) == 503, 15)
    if stop_accepting == "immediately":
        assert wait_until(lambda: refused(ld.addr), 15)
        # read after the refusal was seen: it came before T
        assert ld.drain_elapsed() < t
        assert ld.server_info()["listeners"][0]["accepting"] is False
    else:
        # before T (3 s): accepting and proxying
        r = httpx.get(ld.url("/"))
        assert r.status_code == 200
        assert not refused(ld.addr)
        assert ld.server_info()["listeners"][0]["accepting"] is True
        assert wait_until(lambda: refused(ld.addr), 15)
        assert time.monotonic() - t0 >= t - 0.05  # the server's T runs from after t0
    done = busy.read_response()
    assert done.status == 200 and done.complete
    busy.close()
    assert watch.wait(30) == 0


@pytest.mark.parametrize("min_drain", [0.0, 2.0])
def test_exit_as_soon_as_idle_after_min_drain(lameduck, min_drain: float) -> None:
    """No connection and no request: the process exits at once, or once min_drain has passed,
    long before T (20 s), as Envoy does. The exact moment (at min_drain) is
    tests/unit/test_drain_process.py's TestShutdownStep; here only before T, and not before
    min_drain."""
    ld = lameduck(drain={"time": "20s", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "30s", "min_drain": f"{int(min_drain * 1000)}ms"})
    assert httpx.get(ld.url("/")).status_code == 200
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_active") == 0, 15)
    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    assert watch.wait(30) == 0
    assert watch.at is not None
    took = watch.at - t0
    assert min_drain - 0.05 <= took < 10.0, took  # long before T (20 s)
    assert "cut=0" in drain_report(ld.log())


def test_idle_keepalive_connection_is_closed_proactively_then_exit(lameduck) -> None:
    """An idle keep-alive connection does not hold the exit until the deadline: it is drained
    proactively in [2T/3, T-G) = [2, 2.5) s, closed at +G, and the process exits once none is
    left. The deadline (20 s) is far from T (3 s), so "not at the deadline" holds on a loaded
    machine; how early it closed is the drain report's word (proactively=1), not a client's
    clock (the exact moments: tests/unit/test_downstream_playbook.py)."""
    t, g = 3.0, 0.5
    ld = lameduck(drain={"time": f"{t:g}s", "strategy": "gradual",
                         "connection_grace": f"{int(g * 1000)}ms"},
                  shutdown={"deadline": "20s"})
    idle = RawConn(ld.addr, timeout=25)
    assert idle.request("/").status == 200
    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    assert idle.wait_eof(25)
    closed_at = time.monotonic() - t0
    assert 2 * t / 3 + g - 0.05 <= closed_at < 10.0, closed_at  # not before its moment + G
    idle.close()
    assert watch.wait(25) == 0
    assert watch.at is not None
    assert watch.at - t0 < 10.0  # not at the deadline
    assert "proactively=1" in drain_report(ld.log())


def test_idle_close_on_response_keeps_idle_connections_until_t_plus_g_then_exits(
        lameduck) -> None:
    """``drain.idle_close: on_response``: an idle keep-alive connection is not closed at its
    moment + G (in [5.9, 6.0) s) nor at T (6 s): a request on it is answered and the answer
    says ``Connection: close`` (from T/2 every response drains; past T it is going away); one
    left idle is closed at T + G (7.9 s), and the process exits 0 then. The steps wait on the
    server's own drain clock (``drain.elapsed``), and the look at the idle connection is
    bracketed by two readings of it: 1.9 s of room (G) for a loaded machine, not a client's
    sleep."""
    t, g = 6.0, 1.9
    ld = lameduck(drain={"time": f"{t:g}s", "strategy": "gradual",
                         "connection_grace": f"{g:g}s", "idle_close": "on_response"},
                  shutdown={"deadline": "15s"})
    idle, reused = RawConn(ld.addr, timeout=15), RawConn(ld.addr, timeout=15)
    assert idle.request("/").status == 200 and reused.request("/").status == 200
    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    assert wait_until(lambda: ld.drain_elapsed() >= t / 2, 30, 0.05)
    r = reused.request("/")  # raises if the connection was closed under it
    assert r.status in (200, 503) and r.complete and r.closes, (r.status, r.headers)
    assert reused.wait_eof(15)
    # past every moment + G (< T) and T itself, before T + G
    assert wait_until(lambda: ld.drain_elapsed() >= t + 0.05, 30, 0.05)
    idle.sock.settimeout(0.0)
    with pytest.raises(BlockingIOError):  # nothing yet: no EOF, no reset
        idle.sock.recv(1, socket.MSG_PEEK)
    looked_by = ld.drain_elapsed()
    assert looked_by < t + g, f"the look came after T + G ({looked_by}s): proves nothing"
    idle.sock.settimeout(15.0)
    assert idle.wait_eof(15)
    assert time.monotonic() - t0 >= t + g  # the server's T + G came after the signal
    for c in (idle, reused):
        c.close()
    assert watch.wait(20) == 0
    assert watch.at is not None and watch.at - t0 >= t + g
    assert "at end=1" in drain_report(ld.log())


def test_sigint_twice_exits_immediately(lameduck) -> None:
    """The second SIGINT exits at once: bounded at 10 s (a loaded machine's margin) against a
    drain whose own end, and the request's, are 20 s and more away."""
    ld = lameduck(drain={"time": "20s", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "30s"})
    busy = RawConn(ld.addr)
    busy.send("/sleep?ms=90000")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1, 15)
    ld.signal(signal.SIGINT)
    watch = ExitWatch(ld)
    assert wait_until(lambda: ready_status(ld) == 503, 15)  # the first one starts the drain
    time.sleep(0.2)
    assert watch.code is None, "one SIGINT must drain, not exit"
    t1 = time.monotonic()
    ld.signal(signal.SIGINT)
    r = busy.read_response()
    assert r.status == 503  # cut before any response byte
    code = watch.wait(15)
    assert watch.at is not None
    assert watch.at - t1 < 10.0
    assert code == 3
    log = ld.log()
    assert "second SIGINT: quit requested: exiting at once" in log
    assert "cut=1" in drain_report(log)
    busy.close()


def test_streaming_response_is_reset_at_the_deadline(lameduck) -> None:
    """At the deadline (3 s) a response already streaming (for 60 s) cannot become a 503: the
    connection is reset, the client sees an incomplete body, and it is counted as cut_reset."""
    deadline = 3.0
    ld = lameduck(drain={"time": "2s", "strategy": "gradual", "connection_grace": "500ms"},
                  shutdown={"deadline": f"{deadline:g}s"})
    stream = RawConn(ld.addr, timeout=30)
    stream.send(STREAM)
    head = stream.read_response(head_only=True)
    assert head.status == 200
    assert head.header("transfer-encoding") == "chunked"
    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    body, complete = stream.read_chunked()
    ended = time.monotonic() - t0
    assert not complete
    assert 0 < len(body) < STREAM_BYTES
    # at the deadline (from after t0), well before the stream's own end (60 s)
    assert deadline - 0.05 <= ended < deadline + 15, ended
    assert watch.wait(30) == 3
    report = drain_report(ld.log())
    assert "cut=1 (503=0 reset=1)" in report
    stream.close()


def test_streaming_response_seen_by_httpx_as_incomplete(lameduck) -> None:
    """The same cut seen by a real client library: httpx reports the body as broken."""
    ld = lameduck(drain={"time": "2s", "strategy": "immediate", "connection_grace": "500ms"},
                  shutdown={"deadline": "3s"})
    got = 0
    with httpx.stream("GET", ld.url(STREAM), timeout=30) as r:
        assert r.status_code == 200
        it = r.iter_bytes()
        got += len(next(it))
        ld.signal(signal.SIGTERM)
        with pytest.raises(httpx.HTTPError):
            for piece in it:
                got += len(piece)
    assert 0 < got < STREAM_BYTES
    assert ld.wait(30) == 3


def test_cut_close_delimited_response_is_a_real_reset(lameduck) -> None:
    """An HTTP/1.0 client gets a close-delimited body: only a TCP reset tells it the body was
    cut; a FIN would make the truncated body look complete."""
    ld = lameduck(drain={"time": "2s", "strategy": "gradual", "connection_grace": "500ms"},
                  shutdown={"deadline": "3s"})
    conn = RawConn(ld.addr, timeout=30)
    conn.sock.sendall(f"GET {STREAM} HTTP/1.0\r\n\r\n".encode())
    head = conn.read_response(head_only=True)
    assert head.status == 200
    assert head.header("transfer-encoding") is None  # close-delimited for HTTP/1.0
    ld.signal(signal.SIGTERM)
    while conn._more():
        pass
    assert ld.wait(30) == 3
    conn.close()
    assert conn.reset, f"the client saw a clean EOF after {len(conn.buf)} body bytes"
    assert len(conn.buf) < STREAM_BYTES
