"""The admin API over real sockets: methods, /ready states, /server_info, /listeners,
/stats (text, filter, JSON, Prometheus), health-check fail/ok on a live keep-alive connection,
/quitquitquit, Envoy's stat names, and the loopback-only rule."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from lameduck import cli
from tests.procs import RawConn, base_config, unique, wait_until

GET_PATHS = ["/", "/ready", "/server_info", "/listeners", "/stats", "/stats/prometheus"]
POST_PATHS = ["/drain_listeners", "/healthcheck/fail", "/healthcheck/ok", "/quitquitquit"]


def test_every_endpoint_and_wrong_methods(lameduck) -> None:
    ld = lameduck()
    with httpx.Client(base_url=f"http://{ld.admin_addr}", timeout=5) as c:
        for path in GET_PATHS:
            r = c.get(path)
            assert r.status_code == 200, path
            head = c.head(path)
            assert head.status_code == 200 and head.content == b"", path
            for method in ("POST", "PUT", "DELETE"):
                r = c.request(method, path)
                assert r.status_code == 405, (method, path)
                assert r.headers["allow"] == "GET, HEAD", (method, path)
        for path in POST_PATHS:
            for method in ("GET", "HEAD", "PUT"):
                r = c.request(method, path)
                assert r.status_code == 405, (method, path)
                assert r.headers["allow"] == "POST", (method, path)
        # None of the refused calls changed anything: still live, no drain, still running.
        assert c.get("/ready").text == "LIVE\n"
        assert c.get("/server_info").json()["drain"]["active"] is False
        assert ld.proc is not None and ld.proc.poll() is None
        assert c.get("/nope").status_code == 404
        # The index lists every endpoint with its method.
        index = c.get("/").text
        for path in GET_PATHS:
            assert re.search(rf"^GET\s+{re.escape(path)}$", index, re.M), path
        for path in POST_PATHS:
            assert re.search(rf"^POST\s+{re.escape(path)}$", index, re.M), path
        # State-changing calls answer OK.
        for path in ("/healthcheck/fail", "/healthcheck/ok",
                     "/drain_listeners?graceful&skip_exit"):
            r = c.post(path)
            assert (r.status_code, r.text) == (200, "OK\n"), path


def test_listeners_shows_the_ports_bound(lameduck, origin_port: int) -> None:
    """Envoy's /listeners: one ``name::address`` line per listener, or its JSON
    ``listener_statuses``; a listener configured on port 0 shows the port the kernel gave it,
    the one it serves on (as /server_info says too)."""
    cfg = base_config(origin_port)
    cfg["listeners"].append(dict(cfg["listeners"][0], name="v6", address="[::1]:0"))
    ld = lameduck(cfg)
    info = {ls["name"]: ls["address"] for ls in ld.server_info()["listeners"]}
    r = ld.admin("GET", "/listeners")
    assert r.headers["content-type"].startswith("text/plain")
    assert r.text == f"ingress::{info['ingress']}\nv6::{info['v6']}\n", r.text
    assert re.fullmatch(r"127\.0\.0\.1:[1-9]\d*", info["ingress"]), info
    assert re.fullmatch(r"\[::1\]:[1-9]\d*", info["v6"]), info
    r = ld.admin("GET", "/listeners?format=json")
    assert r.headers["content-type"].startswith("application/json")
    statuses = r.json()["listener_statuses"]
    assert [(st["name"], st["local_address"]["socket_address"]) for st in statuses] == [
        ("ingress", {"address": "127.0.0.1", "port_value": int(info["ingress"].split(":")[1])}),
        ("v6", {"address": "::1", "port_value": int(info["v6"].rsplit(":", 1)[1])})]
    for addr in info.values():
        assert httpx.get(f"http://{addr}/", timeout=5).status_code == 200


def test_server_info_json(lameduck) -> None:
    ld = lameduck(drain={"time": "2s", "strategy": "gradual", "connection_grace": "200ms"})
    r = ld.admin("GET", "/server_info")
    assert r.headers["content-type"].startswith("application/json")
    info = r.json()
    for key in ("version", "state", "uptime_current_epoch", "uptime_all_epochs",
                "command_line_options", "drain", "listeners"):
        assert key in info, key
    assert info["version"].startswith("lameduck/")
    assert info["state"] == "LIVE"
    assert re.fullmatch(r"\d+s", info["uptime_current_epoch"])
    assert info["command_line_options"] == {"config_path": str(ld.path), "drain_time": "2s",
                                            "drain_strategy": "Gradual"}
    assert info["pid"] == ld.pid
    assert info["drain"] == {"active": False}
    # the health-check path's probers and top talkers (leave: confirm), none yet
    assert info["listeners"][0].pop("lb_probes") == {"probers": [], "top_talkers": [],
                                                     "peers": 0, "evicted": 0}
    assert info["listeners"] == [{"name": "ingress", "address": ld.addr, "accepting": True,
                                  "draining": False, "connections": 0}]
    ld.admin("POST", "/drain_listeners?graceful&skip_exit")
    d = ld.server_info()["drain"]
    assert d["active"] is True
    for key in ("cause", "started", "elapsed", "strategy", "time", "connection_grace"):
        assert key in d, key
    assert (d["strategy"], d["time"], d["connection_grace"]) == ("gradual", 2.0, 0.2)
    assert abs(d["started"] - time.time()) < 5
    assert "deadline" not in d  # only a shutdown has one


def test_ready_healthcheck_fail_and_ok_on_a_keepalive_connection(lameduck) -> None:
    ld = lameduck()
    ready = ld.admin("GET", "/ready")
    assert (ready.status_code, ready.text) == (200, "LIVE\n")
    conn = RawConn(ld.addr)
    r = conn.request("/")
    assert r.status == 200 and not r.closes
    assert httpx.get(ld.url("/health_check.html")).status_code == 200

    assert ld.admin("POST", "/healthcheck/fail").text == "OK\n"
    ready = ld.admin("GET", "/ready")
    assert (ready.status_code, ready.text) == (503, "DRAINING\n")
    assert ld.server_info()["state"] == "DRAINING"
    stats = ld.stats()
    assert (stats["server.state"], stats["server.live"]) == (1, 0)
    # The next response on the live keep-alive connection carries Connection: close.
    r = conn.request("/")
    assert r.status == 200 and r.closes
    assert conn.wait_eof(3)
    conn.close()
    # The listener's health-check path turns 503; a new connection is drained at once.
    hc = httpx.get(ld.url("/health_check.html"))
    assert (hc.status_code, hc.text) == (503, "DRAINING\n")
    with httpx.Client() as c:
        assert c.get(ld.url("/")).headers["connection"] == "close"
    assert ld.stat("http.ingress.downstream_cx_drain_close") >= 2
    assert ld.stat("server.drain.cx_drained_proactive") == 0  # no T: nothing proactive

    assert ld.admin("POST", "/healthcheck/ok").text == "OK\n"
    ready = ld.admin("GET", "/ready")
    assert (ready.status_code, ready.text) == (200, "LIVE\n")
    assert ld.stat("server.live") == 1
    conn = RawConn(ld.addr)
    for _ in range(3):
        r = conn.request("/")
        assert r.status == 200 and not r.closes
    conn.close()
    hc = httpx.get(ld.url("/health_check.html"))
    assert (hc.status_code, hc.text) == (200, "OK\n")


DRAIN_SH_FILTER = "downstream_rq_active|upstream_rq_active"


def test_stats_text_filter_json_and_bad_regex(lameduck) -> None:
    ld = lameduck()
    assert httpx.get(ld.url("/")).status_code == 200
    base = f"http://{ld.admin_addr}"
    # The exact command line of the usual Envoy drain.sh preStop script.
    out = subprocess.run(["curl", "-s", f"{base}/stats?filter={DRAIN_SH_FILTER}"],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["cluster.app.upstream_rq_active: 0",
                                "http.ingress.downstream_rq_active: 0"]
    text = ld.admin("GET", "/stats").text
    lines = text.splitlines()
    # counters and gauges as `name: int`, sorted; then the histograms (Envoy's quantiles)
    first_hist = next(i for i, ln in enumerate(lines) if ln.endswith(("No recorded values", ")")))
    plain, hists = lines[:first_hist], lines[first_hist:]
    assert plain == sorted(plain)
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+: -?\d+", ln) for ln in plain), plain
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+: (No recorded values|P0\(.*\))", ln)
               for ln in hists), hists
    assert any(ln.startswith("http.ingress.downstream_rq_time: P0(") for ln in hists), hists
    assert "http.ingress.downstream_rq_2xx: 1" in lines

    r = httpx.get(f"{base}/stats", params={"filter": DRAIN_SH_FILTER, "format": "json"})
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"stats": [{"name": "cluster.app.upstream_rq_active", "value": 0},
                                  {"name": "http.ingress.downstream_rq_active", "value": 0}]}
    full = ld.admin("GET", "/stats?format=json").json()
    assert set(full) == {"stats"}
    *plain_stats, hist = full["stats"]  # Envoy's: the histograms last, in one element
    assert all(set(s) == {"name", "value"} and isinstance(s["value"], int)
               for s in plain_stats)
    assert set(hist) == {"histograms"}
    assert {"supported_quantiles", "computed_quantiles"} <= set(hist["histograms"])

    for fmt in ({}, {"format": "json"}):
        bad = httpx.get(f"{base}/stats", params={"filter": "(unclosed", **fmt})
        assert bad.status_code == 400, fmt
        assert "invalid filter regex" in bad.text


PROM_SAMPLE = re.compile(
    r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
    r'(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? -?\d+(\.\d+)?')


def test_prometheus_exposition(lameduck) -> None:
    ld = lameduck()
    assert httpx.get(ld.url("/")).status_code == 200
    r = ld.admin("GET", "/stats/prometheus")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    typed: set[str] = set()
    samples: dict[str, str] = {}
    helped: set[str] = set()
    for line in r.text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split(" ", 3)[2])
            continue
        if line.startswith("#"):
            m = re.fullmatch(r"# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) "
                             r"(counter|gauge|untyped|histogram)", line)
            assert m, line
            assert m.group(1) not in typed, f"family typed twice: {line}"
            assert m.group(1) in helped, f"no HELP before: {line}"
            typed.add(m.group(1))
            continue
        assert PROM_SAMPLE.fullmatch(line) or re.fullmatch(r".* [0-9.e+-]+", line), line
        series, value = line.rsplit(" ", 1)
        assert series not in samples, f"duplicate series {series}"
        samples[series] = value
        family = re.sub(r"_(bucket|sum|count)$", "", series.split("{", 1)[0])
        assert series.split("{", 1)[0] in typed or family in typed, (
            f"sample before its TYPE line: {line}")
    key = 'envoy_http_downstream_rq_active{envoy_http_conn_manager_prefix="ingress"}'
    assert samples[key] == "0"
    assert samples['envoy_cluster_upstream_rq_active{envoy_cluster_name="app"}'] == "0"
    assert samples['envoy_http_downstream_rq_xx{envoy_response_code_class="2",'
                   'envoy_http_conn_manager_prefix="ingress"}'] == "1"
    assert samples["envoy_server_live"] == "1"
    # A listener's name is a label (Envoy's envoy_listener_address), never in the family.
    key = 'envoy_listener_downstream_global_cx_overflow{envoy_listener_address="ingress"}'
    assert samples[key] == "0"
    assert not [s for s in samples if s.split("{")[0].count("ingress")], samples
    # The client libraries' process_* metrics, read by prometheus_client's own parser.
    from prometheus_client.parser import text_string_to_metric_families

    parsed = {f.name: f for f in text_string_to_metric_families(r.text)}
    proc = {n: f.samples[0].value for n, f in parsed.items() if n.startswith("process_")}
    assert set(proc) == {"process_cpu_seconds", "process_virtual_memory_bytes",
                         "process_resident_memory_bytes", "process_start_time_seconds",
                         "process_open_fds", "process_max_fds"}
    assert 0 < proc["process_open_fds"] <= proc["process_max_fds"]
    assert proc["process_max_fds"] == _soft_nofile(ld.pid)
    assert proc["process_cpu_seconds"] > 0 and proc["process_resident_memory_bytes"] > 1 << 20
    # The same series through ?format=prometheus (values move on: uptime, CPU time).
    again = ld.admin("GET", "/stats?format=prometheus").text
    assert _series(again) == _series(r.text)


def _soft_nofile(pid: int) -> int:
    """The process's soft RLIMIT_NOFILE, from /proc/PID/limits."""
    text = Path(f"/proc/{pid}/limits").read_text()
    return int(next(ln for ln in text.splitlines() if ln.startswith("Max open files")).split()[3])


def _series(text: str) -> list[str]:
    """The exposition without its values: HELP and TYPE lines, and each sample's series."""
    return [ln if ln.startswith("#") else ln.rsplit(" ", 1)[0] for ln in text.splitlines()]


STAT_NAMES = [
    "http.ingress.downstream_cx_active",
    "http.ingress.downstream_rq_active",
    "http.ingress.downstream_cx_drain_close",
    "http.ingress.downstream_rq_total",
    *(f"http.ingress.downstream_rq_{n}xx" for n in range(1, 6)),
    "cluster.app.upstream_rq_active",
    "cluster.app.upstream_cx_active",
    "server.live",
    "server.state",
    "listener_manager.total_listeners_draining",
    "server.drain.active",
    "server.drain.completed",
    "server.drain.refused",
    "server.drain.cut",
    "server.drain.cut_reset",
    "server.drain.cx_drained_proactive",
]


def test_stat_names_from_the_issue_exist_and_move(lameduck) -> None:
    ld = lameduck()
    stats = ld.stats()
    missing = [n for n in STAT_NAMES if n not in stats]
    assert not missing, missing
    assert (stats["server.live"], stats["server.state"]) == (1, 0)
    with httpx.Client() as c:
        assert c.get(ld.url("/")).status_code == 200
        assert c.get(ld.url("/status/404")).status_code == 404
        stats = ld.stats()
        assert stats["http.ingress.downstream_cx_active"] == 1
        assert stats["cluster.app.upstream_cx_active"] == 1  # pooled keep-alive upstream
    stats = ld.stats()
    assert stats["http.ingress.downstream_rq_total"] == 2
    assert stats["http.ingress.downstream_rq_2xx"] == 1
    assert stats["http.ingress.downstream_rq_4xx"] == 1
    assert stats["http.ingress.downstream_rq_active"] == 0


def test_quitquitquit_exits(lameduck) -> None:
    ld = lameduck()
    assert httpx.get(ld.url("/")).status_code == 200
    r = ld.admin("POST", "/quitquitquit")
    assert (r.status_code, r.text) == (200, "OK\n")
    assert ld.wait(5) == 0  # nothing was in flight
    assert "POST /quitquitquit: quit requested: exiting at once" in ld.log()
    assert "POST /quitquitquit: no request in flight" in ld.log()


def test_quitquitquit_cuts_what_is_in_flight_and_says_so(lameduck) -> None:
    """Envoy's /quitquitquit exits at once: the log names it, not a drain deadline."""
    ld = lameduck()
    c = RawConn(ld.addr)
    c.send("/sleep?ms=8000")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1)
    t0 = time.monotonic()
    ld.admin("POST", "/quitquitquit")
    assert ld.wait(5) == 3  # a request was cut
    assert time.monotonic() - t0 < 2.0
    log = ld.log()
    assert "POST /quitquitquit: cutting 1 requests still in flight" in log, log
    assert "deadline" not in log.split("quit requested", 1)[1], log
    c.close()


def test_graceful_drain_without_skip_exit_exits_after_t(lameduck) -> None:
    """Envoy's admin: ``skip_exit`` is "do not exit after the drain period"; without it the
    process exits at the end of the drain, with the drain's exit code (0: nothing cut)."""
    ld = lameduck(drain={"time": "800ms", "strategy": "gradual", "connection_grace": "200ms"})
    c = RawConn(ld.addr)
    c.send("/sleep?ms=400")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1)
    t0 = time.monotonic()
    assert ld.admin("POST", "/drain_listeners?graceful").text == "OK\n"
    assert ld.admin("GET", "/ready").status_code == 200  # LIVE until the drain ends
    r = c.read_response()
    assert r.status == 200 and r.complete
    assert ld.wait(10) == 0, ld.log()
    assert time.monotonic() - t0 >= 0.75  # not before T, although idle since 400 ms
    log = ld.log()
    assert "skip_exit=False inboundonly=False listeners=1; exits at the end of the drain" in log
    assert "drain_listeners without skip_exit: drain time reached, exiting" in log, log
    c.close()


def test_graceful_drain_without_skip_exit_cuts_at_the_deadline(lameduck) -> None:
    """A request still running at T gets until shutdown.deadline (from the drain's start),
    then is cut: exit code 3, as a SIGTERM drain's."""
    ld = lameduck(drain={"time": "500ms", "strategy": "gradual", "connection_grace": "100ms"},
                  shutdown={"deadline": "1500ms"})
    c = RawConn(ld.addr)
    c.send("/sleep?ms=8000")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1)
    t0 = time.monotonic()
    ld.admin("POST", "/drain_listeners?graceful")
    assert ld.wait(10) == 3, ld.log()
    assert 1.4 <= time.monotonic() - t0 < 4.0
    assert "deadline: cutting 1 requests still in flight" in ld.log()
    c.close()


@pytest.mark.parametrize("query", ["graceful&skip_exit", ""])
def test_skip_exit_or_a_drain_that_is_not_graceful_stays_up(lameduck, query: str) -> None:
    ld = lameduck(drain={"time": "500ms", "strategy": "gradual", "connection_grace": "100ms"})
    assert ld.admin("POST", f"/drain_listeners?{query}").text == "OK\n"
    assert wait_until(lambda: ld.stat("server.drain.active") == 0, 5)  # past T, idle
    time.sleep(0.3)  # a margin past T for an exit that must not come
    assert ld.proc is not None and ld.proc.poll() is None
    assert ld.admin("GET", "/ready").status_code == 200
    assert "stays up" in ld.log()


def _write(tmp_path, cfg: dict):
    path = tmp_path / f"cfg-{unique()}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_non_loopback_admin_refused_by_lameduck_validate(tmp_path) -> None:
    cfg = base_config(8080)
    cfg["admin"] = {"address": "0.0.0.0:9901"}
    cmd = [sys.executable, "-m", "lameduck", "validate", "-c"]
    out = subprocess.run([*cmd, str(_write(tmp_path, cfg))], capture_output=True, text=True,
                         timeout=30, check=False)
    assert out.returncode == 2, out
    assert "admin.address" in out.stderr
    assert "allow_non_loopback" in out.stderr
    cfg["admin"]["allow_non_loopback"] = True
    out = subprocess.run([*cmd, str(_write(tmp_path, cfg))], capture_output=True, text=True,
                         timeout=30, check=False)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("host", "ok"), [
    ("192.0.2.10", False), ("[::]", False), ("[2001:db8::1]", False), ("localhost", True),
    ("127.0.0.2", True), ("[::1]", True), ("[::ffff:127.0.0.1]", True),
])
def test_loopback_rule_per_address(tmp_path, capsys: pytest.CaptureFixture, host: str,
                                   ok: bool) -> None:
    cfg = base_config(8080)
    cfg["admin"] = {"address": f"{host}:9901"}
    code = cli.main(["validate", "-c", str(_write(tmp_path, cfg))])
    err = capsys.readouterr().err
    assert code == (0 if ok else 2), err
    if not ok:
        assert "admin.address" in err


def test_admin_keepalive_and_head(lameduck) -> None:
    """One admin connection answers many requests (pollers such as drain.sh keep it)."""
    ld = lameduck()
    conn = RawConn(ld.admin_addr)
    for _ in range(5):
        r = conn.request("/ready")
        assert (r.status, r.body) == (200, b"LIVE\n") and not r.closes
    r = conn.request("/ready", "HEAD")
    assert r.status == 200 and r.header("content-length") == "5"
    r = conn.request("/ready", headers={"Connection": "close"})
    assert r.status == 200 and r.closes
    assert conn.wait_eof(2)
    conn.close()
    info = json.loads(RawConn(ld.admin_addr).request("/server_info").body)
    assert info["state"] == "LIVE"
    assert wait_until(lambda: ld.proc is not None and ld.proc.poll() is None, 0.1)
