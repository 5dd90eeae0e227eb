"""Envoy's admin endpoints that scripts use, against a real lameduck: /stats?usedonly and
?type=, POST /reset_counters, /help from the router's own table, /config_dump with secrets
redacted, and /logging."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from lameduck.admin.handlers import AdminHandlers, redact
from tests.procs import Lameduck, RawConn, base_config


def stats(ld: Lameduck, query: str) -> dict[str, int]:
    r = ld.admin("GET", f"/stats?format=json&{query}")
    assert r.status_code == 200, r.text
    # the histograms come last, in an element of their own (Envoy's), without a name
    return {s["name"]: s["value"] for s in r.json()["stats"] if "name" in s}


def test_usedonly_hides_untouched_stats(lameduck) -> None:
    """A stat shows under usedonly once it has been non-zero; untouched ones never do."""
    ld = lameduck()
    every = stats(ld, "")
    used = stats(ld, "usedonly")
    assert "http.ingress.downstream_rq_5xx" in every
    assert "http.ingress.downstream_rq_5xx" not in used
    assert "http.ingress.downstream_rq_total" not in used  # no request proxied yet
    assert set(used) < set(every) and all(v != 0 for v in used.values()), used
    assert httpx.get(ld.url("/"), timeout=5).status_code == 200
    used = stats(ld, "usedonly")
    assert used["http.ingress.downstream_rq_total"] == 1
    assert used["http.ingress.downstream_rq_2xx"] == 1
    assert "http.ingress.downstream_rq_5xx" not in used
    # text and filter combine with it
    text = ld.admin("GET", "/stats?usedonly&filter=downstream_rq_").text
    assert "http.ingress.downstream_rq_total: 1\n" in text
    assert "downstream_rq_5xx" not in text


def test_type_selects_counters_or_gauges(lameduck) -> None:
    ld = lameduck()
    counters = stats(ld, "type=Counters")
    gauges = stats(ld, "type=Gauges")
    every = stats(ld, "")
    assert "http.ingress.downstream_rq_total" in counters
    assert "http.ingress.downstream_cx_active" not in counters
    assert "http.ingress.downstream_cx_active" in gauges
    assert "http.ingress.downstream_rq_total" not in gauges
    assert set(counters) | set(gauges) == set(every) and not set(counters) & set(gauges)
    # the same stats with the same values, but for the clock (a busy machine's second passes
    # between the two reads)
    assert ({k: v for k, v in stats(ld, "type=All").items() if k != "server.uptime"}
            == {k: v for k, v in every.items() if k != "server.uptime"})
    assert stats(ld, "type=Histograms") == {}  # no counter or gauge
    hist = ld.admin("GET", "/stats?type=Histograms").text
    assert "http.ingress.downstream_rq_time: " in hist and "downstream_rq_total" not in hist
    assert set(stats(ld, "type=Gauges&filter=^http\\.ingress\\.")) == {
        n for n in gauges if n.startswith("http.ingress.")}
    text = ld.admin("GET", "/stats?type=Counters&filter=downstream_rq_total").text
    assert text == "http.ingress.downstream_rq_total: 0\n", text
    r = ld.admin("GET", "/stats?type=counters")
    assert r.status_code == 400 and "type" in r.text


def test_reset_counters_keeps_gauges(lameduck) -> None:
    """Counters read 0 after the reset, a gauge keeps its value (an open connection), and
    the counters count on from 0."""
    ld = lameduck()
    for _ in range(2):
        assert httpx.get(ld.url("/"), timeout=5).status_code == 200
    conn = RawConn(ld.addr)
    try:
        assert conn.request("/").status == 200  # kept open: downstream_cx_active 1
        before = stats(ld, "")
        assert before["http.ingress.downstream_rq_total"] == 3
        assert before["http.ingress.downstream_cx_active"] == 1
        assert ld.admin("GET", "/reset_counters").status_code == 405
        assert stats(ld, "")["http.ingress.downstream_rq_total"] == 3
        r = ld.admin("POST", "/reset_counters")
        assert (r.status_code, r.text) == (200, "OK\n")
        after = stats(ld, "")
        assert after["http.ingress.downstream_rq_total"] == 0
        assert after["http.ingress.downstream_cx_total"] == 0
        assert after["http.ingress.downstream_cx_active"] == 1
        assert all(after[n] == 0 for n in stats(ld, "type=Counters")), after
        # used before the reset: still shown under usedonly, as Envoy does
        assert stats(ld, "usedonly")["http.ingress.downstream_rq_total"] == 0
        assert conn.request("/").status == 200
        assert stats(ld, "")["http.ingress.downstream_rq_total"] == 1
    finally:
        conn.close()


def test_help_lists_every_route_the_router_serves(lameduck) -> None:
    """/help is made from the routing table: every route, each with a description."""
    ld = lameduck()
    r = ld.admin("GET", "/help")
    assert r.status_code == 200
    head, *lines = r.text.splitlines()
    assert head == "admin commands are:"
    shown = {}
    for line in lines:
        m = re.fullmatch(r"  (/\S*): (.+) \((GET|POST|GET, POST)\)", line)
        assert m, line
        assert m.group(2) != "(undocumented)", line
        shown[m.group(1)] = m.group(3)
    table = AdminHandlers(None)  # type: ignore[arg-type]
    served = {p: m for p, (m, _) in table.routes.items()}
    served.update({p: m for p, (m, _) in table.prefix_routes.items()})
    assert shown == served
    for path, method in served.items():
        if "<" not in path and method == "GET":
            assert ld.admin("GET", path).status_code == 200, path


def test_config_dump_shows_the_effective_config_without_secrets(
        lameduck, origin_port: int, tmp_path: Path) -> None:
    secret = "s3cr3t-admin-token-value"
    token_file = tmp_path / "admin-token"
    token_file.write_text(secret + "\n")
    cfg = base_config(origin_port)
    cfg["admin"]["token_file"] = str(token_file)
    cfg["drain"]["time"] = "3s"
    ld = lameduck(cfg)
    r = ld.admin("GET", "/config_dump")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert secret not in r.text
    dump = json.loads(r.text)
    (entry,) = dump["configs"]
    assert entry["@type"] == "lameduck.BootstrapConfigDump"
    assert entry["config_path"] == str(ld.path)
    boot = entry["bootstrap"]
    assert boot["drain"]["time"] == "3s"  # set in the config
    assert boot["listeners"][0]["idle_timeout"] == "75s"  # a default, filled in
    assert boot["admin"]["token_file"] == str(token_file)  # the path, not the token
    # without the token it is refused, like every admin request
    assert httpx.get(ld.admin_url("/config_dump"), timeout=5).status_code == 401


def test_logging_lists_and_sets_levels(lameduck) -> None:
    ld = lameduck()
    r = ld.admin("GET", "/logging")
    assert r.status_code == 200
    assert r.text.startswith("active loggers:\n")
    assert "  lameduck.admin: info\n" in r.text
    assert ld.admin("GET", "/ready").status_code == 200
    assert "admin: GET /ready: 200" not in ld.log()
    # a GET never changes a level
    assert ld.admin("GET", "/logging?level=debug").status_code == 400
    assert ld.admin("POST", "/logging?level=loud").status_code == 400
    assert ld.admin("POST", "/logging?nosuch=debug").status_code == 400
    assert "  lameduck.admin: info\n" in ld.admin("GET", "/logging").text
    r = ld.admin("POST", "/logging?level=debug")
    assert r.status_code == 200
    assert all(line.endswith(": debug") for line in r.text.splitlines()[1:]), r.text
    assert ld.admin("GET", "/ready").status_code == 200
    assert "DEBUG lameduck.admin: admin: GET /ready: 200" in ld.log()
    # one logger: Envoy's /logging?<logger>=<level>
    r = ld.admin("POST", "/logging?lameduck.admin=error")
    assert "  lameduck.admin: error\n" in r.text and "  lameduck: debug\n" in r.text
    assert ld.admin("GET", "/server_info").status_code == 200
    assert "admin: GET /server_info" not in ld.log()


def test_redact_hides_secret_values_and_keeps_paths() -> None:
    """What /config_dump applies: a secret's value goes, a path to one stays."""
    cfg = {"admin": {"token": "t0k", "token_file": "/run/t", "allow_non_loopback": False},
           "tls": [{"key": "/etc/k.pem", "private_key": "-----BEGIN", "key_password": "pw"}],
           "unset_secret": None}
    assert redact(cfg) == {
        "admin": {"token": "[redacted]", "token_file": "/run/t", "allow_non_loopback": False},
        "tls": [{"key": "/etc/k.pem", "private_key": "[redacted]",
                 "key_password": "[redacted]"}],
        "unset_secret": None}
