"""The admin API against a hostile client: a regex that would backtrack for hours, parameters
that would poison state, and a browser page reaching it by DNS rebinding or a cross-site POST."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx

CATASTROPHIC = r"(\w|\w)*!"  # exponential for a backtracking matcher on any stat name


def _strict_json(text: str) -> Any:
    """json.loads refusing NaN and Infinity, which are not JSON (RFC 8259 §6)."""
    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_catastrophic_filter_does_not_stall_traffic(lameduck) -> None:
    ld = lameduck()
    assert httpx.get(ld.url("/"), timeout=5).status_code == 200
    host, port = ld.admin_addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"GET /stats?filter=" + CATASTROPHIC.replace("\\", "%5C").encode()
                  + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        # The filter request is in; proxied traffic on the same process must still flow.
        started = time.monotonic()
        r = httpx.get(ld.url("/"), timeout=5)
        assert r.status_code == 200
        assert time.monotonic() - started < 3
        # and the filter itself is answered (RE2: linear in the names), matching nothing
        head = s.recv(65536)
        assert head.startswith(b"HTTP/1.1 200"), head


def test_huge_repeat_count_is_400_naming_filter(lameduck) -> None:
    ld = lameduck()
    for flt in (r"\d{99999999999}", r"a{1,5000}", "(a", "(?=a)", "a" * 5000):
        r = httpx.get(ld.admin_url("/stats"), params={"filter": flt}, timeout=5)
        assert r.status_code == 400, (flt, r.status_code, r.text)
        assert "filter" in r.text
    r = httpx.get(ld.admin_url("/stats"),
                  params={"filter": "downstream_rq_active|upstream_rq_active"}, timeout=5)
    assert r.status_code == 200
    assert "http.ingress.downstream_rq_active: 0" in r.text


def test_bad_prestop_changes_nothing(lameduck) -> None:
    ld = lameduck()
    huge = "9" * 400  # digits only, as the duration syntax wants: float() makes it infinite
    for bad in (huge + "h", huge + "s", huge, "1e400h", "nan", "-1s"):
        r = ld.admin("POST", f"/prestop?drain_timeout={bad}&lb_buffer=0s")
        assert r.status_code == 400, (bad, r.text)
        assert "drain_timeout" in r.text
    r = ld.admin("POST", f"/prestop?lb_buffer={huge}ms")
    assert r.status_code == 400 and "lb_buffer" in r.text
    # nothing was started: the first valid request starts the FSM with its own timeouts
    assert "strategy" not in _strict_json(ld.admin("GET", "/server_info").text)["prestop"]
    r = ld.admin("POST", "/prestop?drain_timeout=2s&lb_buffer=0s")
    assert r.status_code == 200, r.text
    view = _strict_json(r.text)
    assert view["drain_timeout"] == 2
    info = _strict_json(ld.admin("GET", "/server_info").text)
    assert info["prestop"]["strategy"] == "hold-health"


def _raw(addr: str, request: bytes) -> bytes:
    """One request over a fresh connection, exactly as given (httpx would set Host itself)."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_browser_requests_are_refused(lameduck) -> None:
    ld = lameduck()
    a = ld.admin_addr
    refused = [
        b"POST /healthcheck/fail HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 0\r\n",
        b"POST /healthcheck/fail HTTP/1.1\r\nHost: evil.example:%s\r\n"
        % a.rsplit(":", 1)[1].encode(),
        b"POST /healthcheck/fail HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n",
        b"POST /healthcheck/fail HTTP/1.1\r\nHost: %s\r\nOrigin: http://evil.example\r\n"
        % a.encode(),
        b"POST /healthcheck/fail HTTP/1.1\r\nHost: %s\r\nOrigin: null\r\n" % a.encode(),
        b"GET /server_info HTTP/1.1\r\nHost: %s\r\nSec-Fetch-Site: cross-site\r\n" % a.encode(),
    ]
    for req in refused:
        answer = _raw(a, req + b"Connection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403 "), (req, answer)
        assert b"forbidden" in answer
    assert httpx.get(ld.admin_url("/ready"), timeout=5).status_code == 200  # still LIVE
    port = a.rsplit(":", 1)[1].encode()
    for host in (b"127.0.0.1", b"127.0.0.1:" + port, b"localhost:" + port, b"LOCALHOST.",
                 b"127.1.2.3:" + port):
        answer = _raw(a, b"GET /ready HTTP/1.1\r\nHost: %s\r\nSec-Fetch-Site: none\r\n"
                         b"Connection: close\r\n\r\n" % host)
        assert answer.startswith(b"HTTP/1.1 200 "), (host, answer)
    # HTTP/1.0 without Host, as HAProxy's `option httpchk GET /ready` sends it
    assert _raw(a, b"GET /ready HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200 ")


def test_bearer_token(lameduck, tmp_path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text("s3cret-token\n")
    ld = lameduck(admin={"token_file": str(token_file)})  # start() polls /ready: see below
    url = ld.admin_url("/server_info")
    r = httpx.get(url, timeout=5)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    for wrong in ("Bearer s3cret", "Bearer s3cret-token-and-more", "Basic s3cret-token"):
        assert httpx.get(url, headers={"Authorization": wrong}, timeout=5).status_code == 401
    r = httpx.get(url, headers={"Authorization": "Bearer s3cret-token"}, timeout=5)
    assert r.status_code == 200 and _strict_json(r.text)["state"] == "LIVE"
    r = httpx.post(ld.admin_url("/healthcheck/fail"), timeout=5,
                   headers={"Authorization": "bearer s3cret-token"})
    assert r.status_code == 200
    # the token does not open the door to a web page
    r = httpx.post(ld.admin_url("/healthcheck/ok"), timeout=5, headers={
        "Authorization": "Bearer s3cret-token", "Origin": "http://evil.example"})
    assert r.status_code == 403
