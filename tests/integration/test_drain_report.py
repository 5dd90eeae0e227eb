"""The drain report, end to end: a real lameduck drains under a little load, keeps the report
(GET /drain_report), writes it to drain.report_dir, and ``lameduck report`` draws it."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import loadgen
from tests.procs import ROOT, Lameduck, _env, wait_until

pytestmark = pytest.mark.usefixtures("workers")

REPORT_LINE = re.compile(
    r"drain report: requests completed=(\d+) refused=(\d+) cut=(\d+) \(503=(\d+) reset=(\d+)\); "
    r"connections drained by response=(\d+) proactively=(\d+) at end=(\d+); "
    r"reset in the accept queue at listener close=(\d+)")
COUNT_KEYS = ("completed", "refused", "cut", "cut_before_response", "cut_reset",
              "cx_drained_by_response", "cx_drained_proactive", "cx_closed_at_end",
              "cx_reset_listener_close")


class Load:
    """tests/loadgen.py in a thread until stopped: keep-alive and fresh connections."""

    def __init__(self, port: int) -> None:
        self.counts = loadgen.Counts()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(port,), daemon=True)
        self.thread.start()

    def _run(self, port: int) -> None:
        asyncio.run(loadgen.run(port, 30, keepalive=6, fresh=2, stop=self.stop,
                                counts=self.counts))

    def end(self) -> None:
        self.stop.set()
        self.thread.join(15)
        assert not self.thread.is_alive()


def column(report: dict[str, Any], name: str) -> list[float]:
    i = report["timeline"]["columns"].index(name)
    return [row[i] for row in report["timeline"]["samples"]]


def test_sigterm_under_load_writes_a_report_that_matches_the_log(lameduck,
                                                                  tmp_path: Path) -> None:
    where = tmp_path / "reports"
    ld: Lameduck = lameduck(drain={"time": "2s", "strategy": "gradual",
                                   "connection_grace": "200ms", "report_dir": str(where)})
    load = Load(ld.port)
    try:
        assert wait_until(lambda: load.counts.ok >= 50, timeout=10), load.counts
        ld.signal(signal.SIGTERM)
        code = ld.wait(15)
    finally:
        load.end()
    assert code == 0, ld.log()
    files = list(where.glob("drain-*.json"))
    assert [f.name.endswith(f"-{ld.pid}.json") for f in files] == [True], files
    report = json.loads(files[0].read_text())
    assert report["pid"] == ld.pid and report["cause"] == "shutdown" and report["shutdown"]
    assert report["started"].endswith("Z")
    cfg = report["config"]
    assert cfg["time"] == 2.0 and cfg["connection_grace"] == 0.2
    assert cfg["strategy"] == "gradual" and cfg["deadline"] == 4.0
    assert cfg["proactive_window"] == pytest.approx([1.333, 1.8], abs=0.001)
    assert cfg["idle_close"] == "immediate"

    # samples every ~100 ms over ~T (the load keeps it busy until T; the deadline is 4 s)
    t = column(report, "t")
    assert t[0] <= 0.3 and 1.9 <= t[-1] <= 4.5, t
    assert len(t) >= 15, t
    assert all(b > a for a, b in itertools.pairwise(t))
    assert max(column(report, "connections")) > 0
    assert report["timeline"]["skipped"] == 0

    # the counts are the log line's, and the timeline's deltas add up to them
    m = REPORT_LINE.search(ld.log())
    assert m is not None, ld.log()
    logged = dict(zip(COUNT_KEYS, map(int, m.groups()), strict=True))
    assert report["counts"] == logged
    for col, key in (("drained_by_response", "cx_drained_by_response"),
                     ("proactive", "cx_drained_proactive"), ("at_end", "cx_closed_at_end"),
                     ("refused", "refused"), ("cut", "cut")):
        assert sum(column(report, col)) == logged[key], (col, report["timeline"])
    assert logged["cx_drained_by_response"] > 0  # under load, the ramp closed some
    assert f"drain report written to {files[0]}" in ld.log()


def test_drain_listeners_skip_exit_keeps_the_report(lameduck) -> None:
    ld: Lameduck = lameduck(drain={"time": "1s", "strategy": "gradual",
                                   "connection_grace": "100ms"})
    assert ld.admin("GET", "/drain_report").json() == {"reports": []}
    assert ld.admin("GET", "/drain_report?last=0").status_code == 400
    with httpx.Client() as client:
        for _ in range(5):
            assert client.get(ld.url("/")).status_code == 200
        assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
        client.get(ld.url("/"))

    def reports() -> list[dict[str, Any]]:
        return ld.admin("GET", "/drain_report").json()["reports"]

    assert wait_until(lambda: len(reports()) == 1, timeout=10), ld.log()
    report = reports()[0]
    assert ld.proc is not None and ld.proc.poll() is None  # it stays up
    assert report["cause"] == "drain_listeners" and not report["shutdown"]
    assert report["config"]["deadline"] is None
    t = column(report, "t")
    # a sample every 100 ms over T = 1 s (a loaded machine can delay a few)
    assert 0.9 <= t[-1] <= 3.0 and len(t) >= 5, t
    assert report["counts"]["completed"] >= 0
    # a second drain: newest first, ?last=1 only that one
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    assert wait_until(lambda: len(reports()) == 2, timeout=10), ld.log()
    newest = ld.admin("GET", "/drain_report?last=1").json()["reports"]
    assert len(newest) == 1 and newest[0]["started"] > report["started"]


def test_drain_listeners_counts_the_requests_completed_during_it(lameduck) -> None:
    """``server.drain.completed`` (the drain report's ``completed``) counts a drain the admin
    started, not only a shutdown. T is long, so every request below is inside the drain
    however slow the machine; the workers' counts reach the main process within 100 ms."""
    ld: Lameduck = lameduck(drain={"time": "60s", "strategy": "gradual",
                                   "connection_grace": "1s"},
                            shutdown={"deadline": "65s"},
                            hot_restart={"parent_shutdown_time": "65s"})
    with httpx.Client() as client:
        assert client.get(ld.url("/")).status_code == 200  # before the drain: not counted
        assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
        for _ in range(6):
            assert client.get(ld.url("/")).status_code == 200
    assert wait_until(lambda: ld.stat("server.drain.completed") == 6, timeout=10), \
        ld.stats()
    assert ld.stat("server.drain.active") == 1


def test_report_draws_a_png(lameduck, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.image

    ld: Lameduck = lameduck(drain={"time": "1s", "strategy": "gradual",
                                   "connection_grace": "100ms"})
    load = Load(ld.port)
    try:
        assert wait_until(lambda: load.counts.ok >= 20, timeout=10), load.counts
        assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
        assert wait_until(
            lambda: ld.admin("GET", "/drain_report").json()["reports"], timeout=10)
    finally:
        load.end()
    src = tmp_path / "report.json"
    src.write_text(ld.admin("GET", "/drain_report?last=1").text)  # the admin answer is drawable
    out = tmp_path / "drain.png"
    r = subprocess.run([sys.executable, "-m", "lameduck", "report", str(src), "--png", str(out)],
                       capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    pixels = matplotlib.image.imread(str(out))
    assert pixels.var() > 0

    bad = tmp_path / "bad.json"
    bad.write_text('{"reports": []}')
    r = subprocess.run([sys.executable, "-m", "lameduck", "report", str(bad), "--png", str(out)],
                       capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "no drain report" in r.stderr
