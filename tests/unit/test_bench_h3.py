"""bench/h3load.py and bench/run.py's HTTP/3 part: arguments, the result line and its
parsing, the rows and what they say (no ratio: no HTTP/3 anchor), the generated listener, and
a short h3load run against a real lameduck HTTP/3 listener (counts, errors, statuses). The
bench itself is run by `make bench`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml

H3LOAD = Path(__file__).resolve().parents[2] / "bench" / "h3load.py"


@pytest.fixture(scope="module")
def h3load(bench) -> ModuleType:
    return bench.h3load  # run.py loads bench/h3load.py by its path


def test_h3load_takes_h2load_s_shape_and_loopback_only(h3load) -> None:
    a = h3load.parse_args(["-c5", "-m10", "-D", "3", "--warm-up-time", "1",
                           "https://127.0.0.1:8443/x?y=1"])
    assert (a.clients, a.streams, a.duration, a.warmup) == (5, 10, 3.0, 1.0)
    assert a.requests == 0  # -D alone: the duration ends it
    assert (a.port, a.path, a.authority) == (8443, b"/x?y=1", b"127.0.0.1:8443")
    assert h3load.parse_args(["https://127.0.0.1:1/"]).requests == 1  # neither: one request
    assert h3load.parse_args(["-n", "7", "-D", "2", "https://127.0.0.1:1/"]).requests == 7
    assert h3load.parse_args(["https://127.0.0.1:1/"]).max_time == h3load.MAX_TIME


@pytest.mark.parametrize("argv", [
    ["https://10.0.0.1:443/"], ["https://example.com:443/"], ["http://127.0.0.1:80/"],
    ["https://127.0.0.1/"], ["-c0", "https://127.0.0.1:1/"], ["-m0", "https://127.0.0.1:1/"],
    ["-n0", "https://127.0.0.1:1/"], ["-D", "-1", "https://127.0.0.1:1/"],
    ["-T", "0", "https://127.0.0.1:1/"],
])
def test_h3load_refuses_other_hosts_and_bad_counts(h3load, argv, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        h3load.parse_args(argv)
    assert e.value.code == 2
    assert "h3load.py: error" in capsys.readouterr().err


def test_h3load_result_line_parses_and_the_last_one_wins(h3load) -> None:
    out = ("h3load: qh3 2.1.0, uvloop loop\nh3load: main period started\n"
           "h3load: requests=1 errors=0 elapsed=0.100 rps=10.0 cpu_us_per_req=1.0 "
           "cpu_pct=1.0\n"
           "h3load: requests=900 errors=12 elapsed=3.001 rps=299.9 cpu_us_per_req=110.5 "
           "cpu_pct=33.1 statuses=503:10,reset:2\n")
    r = h3load.parse_result(out)
    assert r == {"requests": 900, "errors": 12, "elapsed": 3.001, "rps": 299.9,
                 "cpu_us_per_req": 110.5, "cpu_pct": 33.1,
                 "statuses": {"503": 10, "reset": 2}}
    assert h3load.parse_result("h3load: handshake failed: ConnectionError: refused\n") is None


def test_run_parses_h3load_as_it_parses_h2load(bench) -> None:
    ok = bench.parse_h3load("h3load: requests=50 errors=0 elapsed=1.000 rps=50.0 "
                            "cpu_us_per_req=100.0 cpu_pct=5.0\n")
    assert (ok["requests"], ok["rps"], ok["errors"], ok["failed"]) == (50, 50.0, 0, "")
    bad = bench.parse_h3load("h3load: requests=40 errors=10 elapsed=1.000 rps=40.0 "
                             "cpu_us_per_req=100.0 cpu_pct=5.0 statuses=503:10\n")
    assert bad["failed"] == "h3load: 40 succeeded, 10 failed (503: 10)"
    none = bench.parse_h3load("h3load: handshake failed: TimeoutError: \n")
    assert none["failed"].startswith("no h3load result: h3load: handshake failed")


def test_h3_flags_and_their_defaults(bench) -> None:
    a = bench.parse_args([])
    assert a.h3_names == ["lameduck"] and a.h3_quota == bench.H3_QUOTA
    assert (a.h3_duration, a.h3_warmup) == (5.0, 1.0)
    a = bench.parse_args(["--duration", "2", "--h3-quota", "40", "--h3-warmup", "0"])
    assert (a.h3_duration, a.h3_warmup, a.h3_quota) == (2.0, 0.0, 40)
    assert bench.parse_args(["--no-h3"]).h3_names == []
    assert bench.parse_args(["--proxies", "haproxy"]).h3_names == []


@pytest.mark.parametrize("pct", ["5", "101"])
def test_h3_quota_outside_10_to_100_is_refused(bench, pct, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        bench.main(["--h3-quota", pct])
    assert e.value.code == 2
    assert "--h3-quota" in capsys.readouterr().err


def test_both_clients_get_the_same_shape(bench) -> None:
    a = bench.parse_args(["--h3-duration", "4", "--h3-warmup", "1"])
    h3 = bench.h3_client_argv("h3", 9443, a)
    assert h3[:2] == [sys.executable, str(bench.H3LOAD)]
    assert h3[2:] == ["-c5", "-m10", "-D", "4", "--warm-up-time", "1",
                      "https://127.0.0.1:9443/"]
    assert bench.h3_client_argv("h2", 9443, a) == [
        "h2load", "-t1", "-c5", "-m10", "-D4000ms", "--warm-up-time=1000ms",
        "https://127.0.0.1:9443/"]
    assert bench.h3_client_argv("h3", 9443, a, requests=20)[2:] == [
        "-c1", "-m4", "-n", "20", "https://127.0.0.1:9443/"]


def sample(bench, protocol: str, cpu: float, pct: float, load: float, rnd: int = 1,
           failed: str = ""):
    return bench.H3Sample(protocol=protocol, round=rnd, requests=1000, rps=1000.0,
                          cpu_us_per_req=cpu, proxy_cpu_pct=pct, client_us_per_req=50.0,
                          origin_us_per_req=10.0, cpu_pct={0: pct, 1: load}, failed=failed)


def test_the_h3_row_sits_beside_h2_and_says_there_is_no_anchor(bench) -> None:
    a = bench.parse_args(["--h3-quota", "60"])
    part = bench.H3Part(quota_pct=60, saturated_at=51.0, samples=[
        sample(bench, "h3", 300.0, 59.0, 40.0), sample(bench, "h2", 20.0, 58.0, 80.0)])
    rows, info, failures = bench.summarize_h3(part, a)
    assert failures == []
    h3, h2 = rows
    assert h3[:6] == ["h3", "h3load (QUIC)", "1,000", "300.0", "59%", "98%"]
    assert h3[bench.H3_HEADERS.index("vs HAProxy")] == "none (no anchor)"
    assert h3[-1] == "proxy" and h2[-1] == "proxy"
    assert info[0] == ("lameduck CPU per request: HTTP/3 300.0 µs beside HTTP/2 over TLS 20.0 "
                       "µs, same quota, origin and shape (HTTP/3 = 15.00x HTTP/2)")
    # what the load core needs when lameduck is at 51% of a core: 51 x (50 + 10) / cpu
    assert info[1].startswith("the load core lameduck's saturation needs (client + origin "
                              "µs/req x the req/s of lameduck at 51% of a core): h3 ~10%, "
                              "h2 ~153%;")
    assert info[-1].startswith("no ratio and no target for HTTP/3: no HTTP/3 anchor runs on "
                               "this machine (")


def test_an_unsaturated_or_load_bound_figure_is_called_so(bench) -> None:
    a = bench.parse_args([])
    part = bench.H3Part(quota_pct=60, saturated_at=51.0, samples=[
        sample(bench, "h3", 300.0, 40.0, 50.0), sample(bench, "h2", 20.0, 58.0, 99.0)])
    rows, info, _ = bench.summarize_h3(part, a)
    assert rows[0][-1] == "neither" and rows[1][-1] == "proxy + cpu1 (load)"
    assert info[0].endswith("not both saturated with the load core free, see the limit column")
    h3, h2 = (next(x for x in info if x.startswith(f"{p}: not an honest figure"))
              for p in ("h3", "h2"))
    assert h3.startswith("h3: not an honest figure: lameduck at 40% of a core "
                         "(saturated from 51%)") and "lower --h3-quota" not in h3
    assert h2.startswith("h2: not an honest figure: lameduck at 58% of a core "
                         "(saturated from 51%), cpu1 at 99%") and "lower --h3-quota" in h2


def test_a_failed_protocol_reads_failed(bench) -> None:
    a = bench.parse_args([])
    part = bench.H3Part(quota_pct=None, saturated_at=85.0,
                        skipped={"h3": "h3 pre-check: no h3load result: boom"},
                        samples=[sample(bench, "h2", 20.0, 90.0, 80.0),
                                 sample(bench, "h2", 20.0, 90.0, 80.0, rnd=2, failed="x")])
    rows, _, failures = bench.summarize_h3(part, a)
    assert [r[:3] for r in rows] == [["h3", "h3load (QUIC)", "FAILED"],
                                     ["h2", "h2load (TLS)", "FAILED"]]
    assert failures == ["lameduck-h3 h3: h3 pre-check: no h3load result: boom",
                        "lameduck-h3 h2: 1/2 rounds failed; round 2: x"]


def test_the_h3_listener_offers_h2_and_serves_http3(bench, tmp_path: Path) -> None:
    """The generated config (not started: the process is stopped as soon as it is seen)."""
    procs = bench.Procs(tmp_path)
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    try:
        with pytest.raises(bench.BenchError):  # no such files: lameduck exits at once
            bench.start_lameduck(procs, 0, tmp_path, 1, tls_files=(cert, key), h3=True,
                                 name="lameduck-h3")
    finally:
        procs.stop_all()
    cfg = yaml.safe_load((tmp_path / "lameduck-h3.yaml").read_text())
    tls = next(x for x in cfg["listeners"] if x["name"] == bench.TLS_LISTENER)
    assert tls["tls"]["alpn"] == ["h2", "http/1.1"] and tls["http3"] == {}
    assert cfg.get("workers", 1) == 1  # HTTP/3 needs one process


def test_a_phased_tool_is_not_reaped_before_its_last_callback(bench, tmp_path: Path) -> None:
    """A tool that exits right after its last phase line still has its CPU times then."""
    procs = bench.Procs(tmp_path)
    seen: list[int] = []
    proc: list = []

    def started(p) -> None:  # hold the loop back until the tool has exited (not reaped)
        proc.append(p)
        os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)

    rc, out = bench.run_phased(
        procs, 0, "phases", ["sh", "-c", "echo start; echo over"], timeout=30,
        on_line={"over": lambda: seen.append(bench.proc_ticks(proc[0].pid))}, started=started)
    assert rc == 0 and "over" in out
    assert len(seen) == 1  # read from the zombie's /proc/<pid>/stat


@pytest.fixture(scope="module")
def h3_lameduck(bench, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    """A real lameduck started by the bench's own code with the HTTP/3 part's listener, in
    front of the demo origin."""
    if not shutil.which("openssl") or not shutil.which("taskset"):
        pytest.skip("needs openssl and taskset")
    pytest.importorskip("aioquic")
    tmp = tmp_path_factory.mktemp("h3bench")
    procs = bench.Procs(tmp)
    try:
        _, origin_port = bench.start_origin(procs, 0)
        cert, key, _ = bench.make_tls_files(tmp)
        proc, _ = bench.start_lameduck(procs, 0, tmp, origin_port, tls_files=(cert, key),
                                       h3=True, name="lameduck-h3")
        yield bench, procs, proc
    finally:
        procs.stop_all()


def h3load_run(port: int, argv: list[str], path: str = "/") -> tuple[int, str]:
    r = subprocess.run([sys.executable, str(H3LOAD), *argv, f"https://127.0.0.1:{port}{path}"],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("stack", ["qh3", "aioquic"])
def test_h3load_completes_exactly_n_requests_against_lameduck(h3_lameduck, h3load,
                                                              stack) -> None:
    pytest.importorskip(stack)
    _, _, proc = h3_lameduck
    rc, out = h3load_run(proc.tls_port, ["-c2", "-m4", "-n", "60", "--stack", stack])
    assert rc == 0, out
    r = h3load.parse_result(out)
    assert r is not None, out
    assert (r["requests"], r["errors"], r["statuses"]) == (60, 0, {}), out
    assert out.startswith(f"h3load: {stack} ")


def test_h3load_is_bounded_in_time_when_n_is_not_reached(h3_lameduck, h3load) -> None:
    _, _, proc = h3_lameduck
    rc, out = h3load_run(proc.tls_port, ["-c1", "-m1", "-n", "100000000", "-T", "1"])
    assert rc == 1, out
    r = h3load.parse_result(out)
    assert r is not None and r["errors"] == 0 and 0 < r["requests"] < 100_000_000, out
    assert "requests not done within -T 1 s" in out


def test_h3load_counts_non_2xx_as_errors(h3_lameduck, h3load) -> None:
    _, _, proc = h3_lameduck
    rc, out = h3load_run(proc.tls_port, ["-c1", "-m3", "-n", "9"], path="/status/503")
    assert rc == 1, out
    r = h3load.parse_result(out)
    assert r is not None and (r["requests"], r["errors"]) == (0, 9), out
    assert r["statuses"] == {"503": 9}


def test_the_bench_pre_checks_pass_against_lameduck(h3_lameduck) -> None:
    bench, procs, proc = h3_lameduck
    problem, out = bench.h3_precheck(procs, 1, proc.tls_port, "h3")
    assert problem is None, out
    if shutil.which("h2load"):
        problem, out = bench.h3_precheck(procs, 1, proc.tls_port, "h2")
        assert problem is None, out


def test_nothing_listening_fails_fast_without_a_result(h3load, bench) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a UDP port, closed after
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, out = h3load_run(port, ["-n", "1"])
    assert rc == 1 and h3load.parse_result(out) is None, out
    assert "h3load: handshake failed" in out


def test_the_h3_lameduck_is_never_under_proxy_quota(bench, tmp_path: Path) -> None:
    """--h3-quota 100 (no cap) with --proxy-quota set: the HTTP/3 part's lameduck is started
    with quota=False, which keeps it out of --proxy-quota's cgroup; None puts it there."""
    joined: list[str] = []

    class Quota:  # records which process would join --proxy-quota's cgroup
        def group(self, name: str) -> Path:
            joined.append(name)
            return tmp_path / f"{name}.procs"

    procs = bench.Procs(tmp_path)
    procs.quota, procs.quota_cpu = Quota(), 0
    try:
        for name, quota in (("own", False), ("proxy", None)):
            procs.start(name, 0, ["true"], quota=quota).popen.wait(timeout=30)
    finally:
        procs.stop_all()
    assert joined == ["proxy"]
