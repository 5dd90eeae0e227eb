"""SIGTERM / SIGINT lifecycle over real sockets, as the usual graceful-draining recipe has it:
not ready first, then one drain event, then exit on completion or at the deadline, where what
is left is cut (503 before any response byte, a reset after) and counted.

Timing bounds are tolerant (2-core CI machines are noisy): lower bounds follow from the code's
own timers, upper bounds leave room for scheduling.
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


def drain_report(log: str) -> str:
    lines = [ln for ln in log.splitlines() if "drain report:" in ln]
    assert len(lines) == 1, log
    return lines[0]



# -- the graceful-draining recipe: quick ones finish, the slow one is cut ---------------------


def test_quick_finish_slow_cut_idle_keepalive_going_away(lameduck) -> None:
    """drain(150ms) with T=0 immediate: two quick requests finish, the slow one is cut with a
    503, a new request on an idle keep-alive connection is refused with "going away", and the
    process exits shortly after the deadline with exit code 3."""
    ld = lameduck(drain={"time": "0s", "strategy": "immediate"},
                  shutdown={"deadline": "150ms"})
    idle = RawConn(ld.addr)
    first = idle.request("/")
    assert first.status == 200 and not first.closes

    admin = AdminPoller(ld.admin_addr)
    slow = RawConn(ld.addr)
    slow.send("/sleep?ms=2000")
    assert wait_until(lambda: admin.stat("http.ingress.downstream_rq_active") == 1)
    quick = [RawConn(ld.addr), RawConn(ld.addr)]
    quick[0].send("/sleep?ms=20")
    quick[1].send("/sleep?ms=30")
    # All three in flight at SIGTERM (a ~1 ms poll catches the 20 ms window).
    assert wait_until(lambda: admin.stat("http.ingress.downstream_rq_active") == 3, 2, 0)

    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    # Not ready at once; then the idle keep-alive connection's next request is refused.
    assert wait_until(lambda: admin.conn.request("/ready").status == 503, 1)
    gone = idle.request("/")
    assert time.monotonic() - t0 < 0.14, "too slow to try the idle connection before the exit"
    assert gone.status == 503
    assert gone.closes
    assert gone.header("retry-after") is not None
    assert gone.body == b"going away\n"
    assert idle.wait_eof(2)
    # The quick ones finish (with Connection: close: with T=0 every response drains).
    for q, ms in zip(quick, (20, 30), strict=True):
        r = q.read_response()
        assert (r.status, r.body, r.complete) == (200, b"slept %d ms\n" % ms, True)
        assert r.closes
    # The slow one is cut at the deadline: no response byte was sent, so it gets a 503.
    cut = slow.read_response()
    cut_at = time.monotonic() - t0
    assert cut.status == 503 and cut.closes
    assert cut_at >= 0.14
    assert slow.wait_eof(2)

    code = watch.wait(5)
    assert watch.at is not None
    took = watch.at - t0
    assert 0.14 <= took < 2.0, took
    assert code == 3  # it cut
    report = drain_report(ld.log())
    assert "cut=1 (503=1 reset=0)" in report
    assert "refused=1" in report
    for c in (idle, slow, *quick, admin):
        c.close()


# -- SIGTERM: not ready first, keep serving, clean exit ---------------------------------------


def test_sigterm_not_ready_health_check_503_in_flight_completes_exit_0(lameduck) -> None:
    ld = lameduck(listener={"health_check_path": "/health_check.html"},
                  drain={"time": "1s", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "4s", "stop_accepting": "at_drain_end"})
    hc = httpx.get(ld.url("/health_check.html"))
    assert (hc.status_code, hc.text) == (200, "OK\n")
    slow = RawConn(ld.addr)
    slow.send("/sleep?ms=1500")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1)

    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    assert wait_until(lambda: ready_status(ld) == 503, 1)
    ready = ld.admin("GET", "/ready")
    assert (ready.status_code, ready.text) == (503, "DRAINING\n")
    assert ld.server_info()["state"] == "DRAINING"
    # The listener's own health-check path turns 503 too, through curl like a load balancer.
    out = _curl_status(ld.url("/health_check.html"))
    assert out == "503"
    # ... while traffic is still served (before T the listener accepts and proxies).
    r = httpx.get(ld.url("/"))
    assert r.status_code == 200
    assert time.monotonic() - t0 < 1.0, "too slow to observe the drain before T"

    done = slow.read_response()
    assert (done.status, done.body, done.complete) == (200, b"slept 1500 ms\n", True)
    assert done.closes  # after T/2 every response drains its connection
    slow.close()
    assert watch.wait(5) == 0  # nothing was cut
    assert watch.at is not None
    # It exits once the last request is done (T has passed), well before the deadline.
    assert 1.3 <= watch.at - t0 < 3.0
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
    """``immediately`` refuses new connections at once; ``at_drain_end`` accepts until T."""
    ld = lameduck(drain={"time": "800ms", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "4s", "stop_accepting": stop_accepting})
    busy = RawConn(ld.addr)  # keeps the process alive past T
    busy.send("/sleep?ms=1100")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1)
    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    assert wait_until(lambda: ready_status(ld) == 503, 1)
    if stop_accepting == "immediately":
        assert wait_until(lambda: refused(ld.addr), 0.5)
        assert time.monotonic() - t0 < 0.7
        assert ld.server_info()["listeners"][0]["accepting"] is False
    else:
        r = httpx.get(ld.url("/"))
        assert r.status_code == 200
        assert not refused(ld.addr)
        assert ld.server_info()["listeners"][0]["accepting"] is True
        assert time.monotonic() - t0 < 0.7, "too slow to observe the listener before T"
        assert wait_until(lambda: refused(ld.addr), 2)
        assert time.monotonic() - t0 >= 0.75
    done = busy.read_response()
    assert done.status == 200 and done.complete
    busy.close()
    assert watch.wait(5) == 0


@pytest.mark.parametrize("min_drain", [0.0, 0.8])
def test_exit_as_soon_as_idle_after_min_drain(lameduck, min_drain: float) -> None:
    """No connection and no request: the process exits at once, or once min_drain has passed,
    long before T (as Envoy does: https://github.com/envoyproxy/envoy/issues/3837)."""
    ld = lameduck(drain={"time": "3s", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "4s", "min_drain": f"{int(min_drain * 1000)}ms"})
    assert httpx.get(ld.url("/")).status_code == 200
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_active") == 0)
    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    assert watch.wait(5) == 0
    assert watch.at is not None
    took = watch.at - t0
    if min_drain:
        assert min_drain - 0.05 <= took < min_drain + 1.0, took
    else:  # at once: long before T (3 s), with the same slack for a loaded machine
        assert took < 2.0, took
    assert "cut=0" in drain_report(ld.log())


def test_idle_keepalive_connection_is_closed_proactively_then_exit(lameduck) -> None:
    """An idle keep-alive connection does not hold the exit until the deadline: it is drained
    proactively in [2T/3, T-G), closed at +G, and the process exits once none is left. The
    deadline (20 s) is far from T (1.5 s), so "not at the deadline" holds on a loaded machine;
    how early it closed is the drain report's word (proactively=1), not a client's clock."""
    ld = lameduck(drain={"time": "1500ms", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "20s"})
    idle = RawConn(ld.addr, timeout=25)
    assert idle.request("/").status == 200
    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    assert idle.wait_eof(25)
    closed_at = time.monotonic() - t0
    assert 1.0 + 0.2 - 0.1 <= closed_at < 10.0, closed_at  # not before its moment + G
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
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1)
    ld.signal(signal.SIGINT)
    watch = ExitWatch(ld)
    assert wait_until(lambda: ready_status(ld) == 503, 1)  # the first one starts the drain
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
    """At the deadline a response already streaming cannot become a 503: the connection is
    reset, the client sees an incomplete body, and it is counted as cut_reset."""
    ld = lameduck(drain={"time": "500ms", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "1s"})
    stream = RawConn(ld.addr)
    stream.send("/stream?chunks=100&size=16&interval_ms=50")
    head = stream.read_response(head_only=True)
    assert head.status == 200
    assert head.header("transfer-encoding") == "chunked"
    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    watch = ExitWatch(ld)
    stream.sock.settimeout(5)
    body, complete = stream.read_chunked()
    ended = time.monotonic() - t0
    assert not complete
    assert 0 < len(body) < 100 * 16
    assert 0.95 <= ended < 2.5, ended
    assert watch.wait(5) == 3
    report = drain_report(ld.log())
    assert "cut=1 (503=0 reset=1)" in report
    stream.close()


def test_streaming_response_seen_by_httpx_as_incomplete(lameduck) -> None:
    """The same cut seen by a real client library: httpx reports the body as broken."""
    ld = lameduck(drain={"time": "300ms", "strategy": "immediate", "connection_grace": "200ms"},
                  shutdown={"deadline": "600ms"})
    got = 0
    with httpx.stream("GET", ld.url("/stream?chunks=100&size=16&interval_ms=50"),
                      timeout=5) as r:
        assert r.status_code == 200
        it = r.iter_bytes()
        got += len(next(it))
        ld.signal(signal.SIGTERM)
        with pytest.raises(httpx.HTTPError):
            for piece in it:
                got += len(piece)
    assert 0 < got < 1600
    assert ld.wait(5) == 3


def test_cut_close_delimited_response_is_a_real_reset(lameduck) -> None:
    """An HTTP/1.0 client gets a close-delimited body: only a TCP reset tells it the body was
    cut; a FIN would make the truncated body look complete."""
    ld = lameduck(drain={"time": "300ms", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "600ms"})
    conn = RawConn(ld.addr)
    conn.sock.sendall(b"GET /stream?chunks=100&size=16&interval_ms=50 HTTP/1.0\r\n\r\n")
    head = conn.read_response(head_only=True)
    assert head.status == 200
    assert head.header("transfer-encoding") is None  # close-delimited for HTTP/1.0
    ld.signal(signal.SIGTERM)
    conn.sock.settimeout(5)
    while conn._more():
        pass
    assert ld.wait(5) == 3
    conn.close()
    assert conn.reset, f"the client saw a clean EOF after {len(conn.buf)} body bytes"
