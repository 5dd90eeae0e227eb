"""The real TCP listener connection on the one connection drain manager, played with no sockets
on a fake clock: when a relayed byte stream is closed (a FIN both ways), when it is reset, and
what is counted.

T = 12, G = 1, the drain starts at 10: the proactive window is [18, 21) (Envoy's drain
sequence: 2T/3 to T - G); a scripted rng value r puts the connection's moment at 18 + 3r.
The listener's ``quiet_period`` is 0.3 s: from its moment, a connection closes as soon as no
byte has passed for that long.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lameduck.config import ListenerConfig
from lameduck.drain import DrainEvent, ListenerDrain, Strategy
from lameduck.drain.endpoint import AdminState
from lameduck.listeners.tcp import TcpDownstream, TcpListener
from lameduck.proxy.accesslog import AccessLog, LogFile
from lameduck.stats import DrainStats, TcpStats
from lameduck.tunnel.relay import Pending
from tests.drainplay import ScriptedRng
from tests.playbook import Context, Transport

START, T, G, QUIET = 10.0, 12.0, 1.0, 0.3
EV = DrainEvent(START, Strategy.GRADUAL, T, G)


class Dial:
    """What ``TcpListener.open`` returns: a connect the script completes or fails (what it
    reports is delivered at once, as the loop would next)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.callbacks: list[Any] = []
        self.error: Exception | None = None
        self.value: tuple[Transport, Pending] | None = None

    def add_done_callback(self, cb: Any) -> None:
        self.callbacks.append(cb)

    def cancelled(self) -> bool:
        return False

    def exception(self) -> Exception | None:
        return self.error

    def result(self) -> tuple[Transport, Pending]:
        assert self.value is not None
        return self.value

    def succeed(self, ctx: Context) -> Transport:
        up = Transport(ctx.loop)
        pending = Pending()
        up.set_protocol(pending)
        pending.connection_made(up)
        self.value = (up, pending)
        for cb in self.callbacks:
            cb(self)
        self.ctx.loop.run_soon()
        return up

    def fail(self) -> None:
        self.error = ConnectionRefusedError()
        for cb in self.callbacks:
            cb(self)
        self.ctx.loop.run_soon()


class Play(Context):
    """A TCP listener in front of the playbook's cluster, its connects scripted."""

    def __init__(self, *rng: float) -> None:
        super().__init__()
        self.tcp = TcpListener(
            ListenerConfig(name="l4", address="127.0.0.1:0", protocol="tcp", cluster="app",
                           quiet_period=QUIET),
            self.loop, self.process, ListenerDrain("l4", grace=G), self.cluster, TcpStats(),
            DrainStats(), lambda: None, ScriptedRng(*rng))
        self.dials: list[Dial] = []
        self.tcp.open = self.dial  # type: ignore[method-assign]

    def dial(self, cluster: Any, ep: Any) -> Dial:
        d = Dial(self)
        self.dials.append(d)
        return d

    def accept(self) -> tuple[TcpDownstream, Transport]:
        conn = TcpDownstream(self.tcp)
        client = Transport(self.loop)
        client.set_protocol(conn)
        conn.connection_made(client)
        return conn, client

    def relayed(self) -> tuple[TcpDownstream, Transport, Transport]:
        """A connection whose relay runs."""
        conn, client = self.accept()
        up = self.dials[-1].succeed(self)
        return conn, client, up

    def drain_starts(self, *conns: TcpDownstream) -> None:
        self.loop.advance(START)
        self.tcp.drain.add_event(EV)
        for conn in conns:
            conn.on_drain_event(EV)


def send(sock: Transport, data: bytes) -> None:
    """Bytes arrive on ``sock`` (the relay passes them to the other side)."""
    sock.protocol.data_received(data)


def test_quiet_connection_closes_at_its_moment_with_a_fin_both_ways() -> None:
    p = Play(0.5)  # moment 19.5
    conn, client, up = p.relayed()
    send(client, b"ping")
    assert up.out == b"ping"
    p.drain_starts(conn)
    p.loop.advance(19.49)
    assert client.ended is None and up.ended is None
    p.loop.advance(25.0)
    assert client.ended == ("fin", 19.5) and up.ended == ("fin", 19.5)
    st, ds = p.tcp.stats, p.tcp.drain_stats
    assert st.downstream_cx_drain_close == 1 and ds.cx_drained_proactive == 1
    assert st.downstream_cx_active == 0 and st.downstream_cx_cut == 0
    assert p.process.ledger.active == 0
    assert p.eps[0].rq_success == 1 and p.eps[0].cx_active == 0


def test_busy_connection_closes_once_quiet_after_its_moment() -> None:
    p = Play(0.5)  # moment 19.5
    conn, client, up = p.relayed()
    p.drain_starts(conn)
    p.loop.advance(19.4)
    send(up, b"a")  # 19.4: not quiet at the moment (19.5 - 19.4 < 0.3)
    p.loop.advance(19.6)
    send(client, b"b")  # 19.6: still talking; quiet from 19.9 on
    p.loop.advance(19.89)
    assert client.ended is None
    p.loop.advance(30.0)
    assert client.ended == ("fin", pytest.approx(19.9)) and up.ended is not None
    assert up.ended[0] == "fin"
    assert p.tcp.stats.downstream_cx_drain_close == 1


def test_still_busy_at_the_deadline_is_reset_and_counted_as_cut() -> None:
    p = Play(0.0)  # moment 18
    conn, client, up = p.relayed()
    p.drain_starts(conn)
    for i in range(20):
        p.loop.advance(17.1 + 0.2 * i)
        send(client, b"x")  # never quiet for 0.3 s, from before its moment to past 20.9
    p.loop.advance(21.0)
    conn.close_at_end()
    assert client.ended == ("rst", 21.0) and up.ended == ("rst", 21.0)
    st = p.tcp.stats
    assert st.downstream_cx_cut == 1 and st.downstream_cx_drain_close == 0
    assert p.tcp.drain_stats.cx_closed_at_end == 0  # drained at its moment, not at the end
    assert p.process.ledger.active == 0 and p.eps[0].rq_error == 1


def test_drained_while_connecting_closes_once_relaying_and_quiet() -> None:
    p = Play(0.0)  # moment 18
    conn, client = p.accept()
    p.drain_starts(conn)
    p.loop.advance(18.5)
    assert client.ended is None  # nothing to relay yet: it is not closed under the client
    up = p.dials[-1].succeed(p)
    p.loop.advance(18.79)
    assert client.ended is None
    p.loop.advance(19.0)
    assert client.ended == ("fin", pytest.approx(18.8)) and up.ended is not None


def test_connect_failure_is_retried_on_the_other_endpoint_within_the_budget() -> None:
    p = Play()
    _, client = p.accept()
    p.dials[-1].fail()
    assert len(p.dials) == 2 and p.tcp.stats.upstream_connect_fail == 1
    up = p.dials[-1].succeed(p)
    send(client, b"hi")
    assert up.out == b"hi"
    assert p.cluster.stats.upstream_rq_retry == 1
    up.close()  # the upstream ends it
    assert client.ended is not None and client.ended[0] == "fin"
    assert p.tcp.stats.downstream_cx_active == 0 and p.process.ledger.active == 0


def test_no_endpoint_reachable_resets_and_is_not_a_cut() -> None:
    p = Play()
    _, client = p.accept()
    while not p.dials[-1].callbacks or p.dials[-1].error is None:
        p.dials[-1].fail()  # every endpoint, and the retries the policy allows
    assert len(p.dials) == 1 + p.cluster.num_retries
    assert client.ended == ("rst", 0.0)
    st = p.tcp.stats
    assert st.downstream_cx_cut == 0 and st.downstream_cx_active == 0
    assert p.process.ledger.active == 0


# -- the access log: Envoy's TCP proxy line, from the exchange's books -----------------------


def logged(p: Play, tmp_path: Path) -> LogFile:
    """JSON access-log lines for the TCP listener, from loop time 5 (0 reads as "off")."""
    logfile = LogFile(str(tmp_path / "access.log"), p.loop)  # type: ignore[arg-type]
    p.tcp.access_log = AccessLog(logfile, "json", p.loop)  # type: ignore[arg-type]
    p.loop.advance(5.0)
    return logfile


def the_line(logfile: LogFile, tmp_path: Path) -> dict[str, Any]:
    logfile.flush()
    (line,) = [json.loads(x) for x in (tmp_path / "access.log").read_text().splitlines()]
    return line


def books(line: dict[str, Any]) -> tuple[Any, ...]:
    return (line["method"], line["protocol"], line["response_code"], line["response_flags"],
            line["bytes_received"], line["bytes_sent"])


def test_relayed_connection_line_is_0_no_flag_with_the_bytes_each_way(tmp_path: Path) -> None:
    p = Play()
    logfile = logged(p, tmp_path)
    _, client = p.accept()
    send(client, b"early")  # held by the exchange until the upstream is connected
    up = p.dials[-1].succeed(p)
    assert up.out == b"early"
    send(client, b"ping")
    send(up, b"pong!")
    up.close()
    line = the_line(logfile, tmp_path)
    assert books(line) == (None, "-", 0, "-", 9, 5)
    assert line["upstream_cluster"] == "app" and line["upstream_host"] == p.eps[0].address
    assert p.process.ledger.active == 0 and p.tcp.stats.downstream_rq_active == 0


def test_no_healthy_endpoint_line_is_uh_and_the_client_is_reset(tmp_path: Path) -> None:
    p = Play()
    logfile = logged(p, tmp_path)
    for ep in p.eps:
        p.cluster.set_state(ep, AdminState.MAINT, p.loop.time())
    _, client = p.accept()
    assert client.ended == ("rst", 5.0) and p.dials == []
    assert books(the_line(logfile, tmp_path)) == (None, "-", 0, "UH", 0, 0)
    assert p.tcp.stats.downstream_cx_no_route == 1
    assert p.cluster.stats.upstream_cx_none_healthy == 1 and p.process.ledger.active == 0


def test_no_endpoint_reachable_line_is_uf(tmp_path: Path) -> None:
    p = Play()
    logfile = logged(p, tmp_path)
    _, client = p.accept()
    while not p.dials[-1].callbacks or p.dials[-1].error is None:
        p.dials[-1].fail()
    assert client.ended is not None and client.ended[0] == "rst"
    line = the_line(logfile, tmp_path)
    assert books(line)[3] in ("UF", "UF,URX"), line  # retried, then no more allowed
    assert "UF" in line["response_flags"].split(",")


def test_client_gone_while_connecting_line_is_dc(tmp_path: Path) -> None:
    p = Play()
    logfile = logged(p, tmp_path)
    conn, client = p.accept()
    send(client, b"abc")
    conn.connection_lost(None)  # the client went away before the upstream answered
    up = p.dials[-1].succeed(p)
    assert up.ended is not None  # the late connection is closed, nothing relayed
    assert books(the_line(logfile, tmp_path)) == (None, "-", 0, "DC", 3, 0)
    assert p.process.ledger.active == 0 and p.eps[0].cx_active == 0


def test_deadline_cut_lines_are_ca_relayed_and_cb_connecting(tmp_path: Path) -> None:
    p = Play(0.0, 0.0)
    logfile = logged(p, tmp_path)
    relayed, client, _up = p.relayed()
    connecting, client2 = p.accept()
    p.drain_starts(relayed, connecting)
    for i in range(20):
        p.loop.advance(17.1 + 0.2 * i)
        send(client, b"x")  # never quiet for 0.3 s: still relaying at the deadline
    p.loop.advance(21.0)
    relayed.cut()
    connecting.cut()
    assert client.ended == ("rst", 21.0) and client2.ended == ("rst", 21.0)
    logfile.flush()
    lines = [json.loads(x) for x in (tmp_path / "access.log").read_text().splitlines()]
    assert sorted(ln["response_flags"] for ln in lines) == ["CA", "CB"], lines
    ds = p.tcp.drain_stats
    assert (ds.cut_reset, ds.cut_before_response) == (1, 1)
    assert p.process.ledger.active == 0 and p.tcp.stats.downstream_cx_cut == 2


def test_default_format_line_is_envoys_tcp_line(tmp_path: Path) -> None:
    p = Play()
    logfile = LogFile(str(tmp_path / "access.log"), p.loop)  # type: ignore[arg-type]
    p.tcp.access_log = AccessLog(logfile, None, p.loop)  # type: ignore[arg-type]
    p.loop.advance(5.0)
    _, client = p.accept()
    up = p.dials[-1].succeed(p)
    send(client, b"ab")
    up.close()
    logfile.flush()
    line = (tmp_path / "access.log").read_text()
    assert '"- - -" 0 - 2 0 ' in line, line
