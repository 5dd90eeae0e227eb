"""The access log over real sockets: every response flag on the request it belongs to (found
by path), JSON lines that parse, Envoy's default TEXT layout, and x-request-id generated and
passed upstream while traceparent passes unchanged.

Two processes: one drained with SIGTERM at T=0 (going away, cut before and after the response
started, a response that drains its connection), one with a proactive drain window and the
upstream failures (UH, UF, UT, NR, DPE) before it.
"""

from __future__ import annotations

import json
import re
import signal
import socket
from pathlib import Path
from typing import Any

import httpx

from tests.procs import AdminPoller, Lameduck, RawConn, base_config, refusing_port, wait_until

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def by_path(lines: list[dict[str, Any]], path: str) -> dict[str, Any]:
    found = [ln for ln in lines if ln["path"] == path]
    assert len(found) == 1, (path, lines)
    return found[0]


def flags(line: dict[str, Any]) -> set[str]:
    return set(line["response_flags"].split(","))


def drain_flags(line: dict[str, Any]) -> set[str]:
    return set(line["drain_flags"].split(","))


def test_drain_flags_going_away_cut_before_and_after_drained_by_response(
        lameduck: Any, tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    ld: Lameduck = lameduck(
        drain={"time": "0s", "strategy": "immediate", "connection_grace": "100ms"},
        shutdown={"deadline": "600ms"},
        listener={"access_log": {"path": str(log), "format": "json"}})
    admin = AdminPoller(ld.admin_addr)
    idle = RawConn(ld.addr)
    assert idle.request("/?first").status == 200
    slow = RawConn(ld.addr)
    slow.send("/sleep?ms=5000")
    streaming = RawConn(ld.addr)
    streaming.send("/stream?chunks=200&size=10&interval_ms=50")
    quick = RawConn(ld.addr)
    quick.send("/sleep?ms=150")
    assert wait_until(lambda: admin.stat("http.ingress.downstream_rq_active") == 3, 3, 0)

    ld.signal(signal.SIGTERM)
    assert wait_until(lambda: admin.conn.request("/ready").status == 503, 2)
    gone = idle.request("/?late")
    assert gone.status == 503
    assert quick.read_response().closes  # with T=0 every response drains its connection
    assert slow.read_response().status == 503  # cut before any response byte
    streaming.wait_eof(5)
    assert ld.proc is not None and ld.proc.wait(10) == 3  # it cut

    lines = lines_of(log)
    assert flags(by_path(lines, "/?first")) == {"-"}
    late = by_path(lines, "/?late")
    assert (late["response_code"], flags(late)) == (503, {"GA"})
    drained = by_path(lines, "/sleep?ms=150")  # a 200 that drained: no failure flag
    assert (flags(drained), drain_flags(drained)) == ({"-"}, {"RD"}), drained
    cut_before = by_path(lines, "/sleep?ms=5000")
    assert "CB" in flags(cut_before) and cut_before["response_code"] == 503
    cut_after = by_path(lines, "/stream?chunks=200&size=10&interval_ms=50")
    assert "CA" in flags(cut_after) and cut_after["response_code"] == 200
    assert cut_after["bytes_sent"] > 0
    for c in (idle, slow, streaming, quick, admin):
        c.close()


def test_upstream_flags_proactive_drain_request_id_and_default_format(
        origin_port: int, lameduck: Any, tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    text = tmp_path / "access.log"
    dead = refusing_port()
    cfg = base_config(origin_port)
    cfg["drain"] = {"time": "900ms", "strategy": "immediate", "connection_grace": "100ms"}
    cfg["shutdown"] = {"deadline": "5s", "min_drain": "0s", "stop_accepting": "at_drain_end"}
    listener = cfg["listeners"][0]
    listener["access_log"] = {"path": str(log), "format": "json"}
    listener["routes"] = [
        {"prefix": "/", "host": "none.test", "cluster": "maint"},
        {"prefix": "/", "host": "dead.test", "cluster": "dead"},
        {"prefix": "/", "host": "slow.test", "cluster": "app", "timeout": "200ms"},
        {"prefix": "/", "host": "app.test", "cluster": "app"},
    ]
    cfg["listeners"].append({
        "name": "text", "address": "127.0.0.1:0", "access_log": {"path": str(text)},
        "routes": [{"prefix": "/", "cluster": "app"}]})
    cfg["clusters"] += [
        {"name": "maint", "endpoints": [{"address": f"127.0.0.1:{origin_port}",
                                         "state": "maint"}]},
        {"name": "dead", "endpoints": [f"127.0.0.1:{dead}"]},
    ]
    ld: Lameduck = lameduck(cfg)

    def get(host: str, path: str, **headers: str) -> httpx.Response:
        return httpx.get(ld.url(path), headers={"host": host, **headers}, timeout=10)

    assert get("none.test", "/uh").status_code == 503
    assert get("dead.test", "/uf").status_code == 503
    assert get("slow.test", "/sleep?ms=3000").status_code == 504
    assert get("other.test", "/nr").status_code == 404
    echoed = dict(get("app.test", "/headers", traceparent=TRACEPARENT).json()["headers"])
    assert echoed["traceparent"] == TRACEPARENT  # passed through unchanged
    rid = echoed["x-request-id"]
    assert re.fullmatch("[0-9a-f]{32}", rid), echoed  # generated and passed upstream
    get("app.test", "/given", **{"x-request-id": "abc-123"})
    with socket.create_connection((ld.addr.rsplit(":", 1)[0], ld.port)) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    text_resp = httpx.get(f"http://{ld.addr_of('text')}/", headers={"user-agent": "ua/1"})
    assert text_resp.status_code == 200

    admin = AdminPoller(ld.admin_addr)
    busy = RawConn(ld.addr)
    busy.host = "app.test"
    busy.send("/sleep?ms=1200")  # in flight through its connection's proactive moment
    assert wait_until(lambda: admin.stat("http.ingress.downstream_rq_active") == 1, 3, 0)
    ld.signal(signal.SIGTERM)
    assert busy.read_response().status == 200
    assert ld.proc is not None and ld.proc.wait(10) == 0

    lines = lines_of(log)
    expect = {"/uh": ("UH", 503), "/uf": ("UF", 503), "/sleep?ms=3000": ("UT", 504),
              "/nr": ("NR", 404)}
    for path, (flag, status) in expect.items():
        line = by_path(lines, path)
        assert flag in flags(line) and line["response_code"] == status, line
    proactive = by_path(lines, "/sleep?ms=1200")
    assert (proactive["response_code"], proactive["response_flags"]) == (200, "-"), proactive
    assert "PD" in drain_flags(proactive), proactive
    traced = by_path(lines, "/headers")
    assert traced["traceparent"] == TRACEPARENT
    assert traced["request_id"] == rid
    assert traced["protocol"] == "HTTP/1.1" and traced["upstream_cluster"] == "app"
    assert by_path(lines, "/given")["request_id"] == "abc-123"
    dpe = [ln for ln in lines if "DPE" in flags(ln)]
    assert len(dpe) == 1 and dpe[0]["response_code"] == 400

    # Envoy's default format: [START] "METHOD PATH PROTOCOL" CODE FLAGS RX TX DURATION
    # UPSTREAM-SERVICE-TIME "XFF" "USER-AGENT" "REQUEST-ID" "AUTHORITY" "UPSTREAM-HOST"
    (line,) = text.read_text().splitlines()
    assert re.fullmatch(
        r'\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\] "GET / HTTP/1\.1" 200 - 0 \d+ \d+ \d+ '
        r'"127\.0\.0\.1" "ua/1" "[0-9a-f]{32}" "127\.0\.0\.1:\d+" '
        rf'"127\.0\.0\.1:{origin_port}"', line), line
    busy.close()
    admin.close()


def test_default_format_fields_over_http1_and_http2_and_a_reopen_on_sigusr1(
        origin_port: int, lameduck: Any, tmp_path: Path) -> None:
    """The fields Envoy's default line takes from the request, the same over both protocols
    (X-Forwarded-For as sent upstream, the client's address appended; values stripped), and
    logrotate's rename + SIGUSR1: the lines buffered go to the renamed file, the later ones
    to a new file at the path, all of them at exit."""
    text = tmp_path / "access.log"
    ld: Lameduck = lameduck(
        drain={"time": "0s", "strategy": "immediate", "connection_grace": "100ms"},
        listener={"access_log": {"path": str(text)}})
    h1 = RawConn(ld.addr)
    r = h1.request("/?a", headers={"User-Agent": "ua/2  ", "X-Forwarded-For": "203.0.113.7",
                                      "X-Envoy-Original-Path": "/orig"})
    assert r.status == 200
    with httpx.Client(http1=False, http2=True, timeout=5) as h2:
        resp = h2.get(ld.url("/?h2"), headers={"user-agent": "ua/h2",
                                             "x-forwarded-for": "198.51.100.1"})
        assert resp.status_code == 200 and resp.http_version == "HTTP/2"
    rotated = text.rename(tmp_path / "access.log.1")
    ld.signal(signal.SIGUSR1)
    assert wait_until(lambda: "SIGUSR1: reopened the log file" in ld.log(), 5), ld.log()
    assert wait_until(text.exists, 5)
    assert h1.request("/?after").status == 200
    h1.close()
    ld.signal(signal.SIGTERM)
    assert ld.proc is not None and ld.proc.wait(10) == 0

    stamp = r"\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\]"
    rid = r'"[0-9a-f]{32}"'
    authority = rf'"{re.escape(ld.addr)}"'
    upstream = rf'"127\.0\.0\.1:{origin_port}"'
    before = rotated.read_text().splitlines()
    assert len(before) == 2, before
    assert re.fullmatch(
        rf'{stamp} "GET /orig HTTP/1\.1" 200 - 0 \d+ \d+ \d+ "203\.0\.113\.7, 127\.0\.0\.1" '
        rf'"ua/2" {rid} {authority} {upstream}', before[0]), before[0]
    assert re.fullmatch(
        rf'{stamp} "GET /\?h2 HTTP/2" 200 - 0 \d+ \d+ \d+ "198\.51\.100\.1, 127\.0\.0\.1" '
        rf'"ua/h2" {rid} '
        rf'{authority} {upstream}', before[1]), before[1]
    (after,) = text.read_text().splitlines()
    assert re.fullmatch(
        rf'{stamp} "GET /\?after HTTP/1\.1" 200 - 0 \d+ \d+ \d+ "127\.0\.0\.1" "-" {rid} '
        rf'{authority} {upstream}', after), after
