"""The process log, read from real processes: ISO 8601 times with the date and zone, JSON
lines, the log options before or after the subcommand, and upstream errors named by endpoint
and rate-limited so a dead origin cannot flood the log."""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.procs import Lameduck, base_config, refusing_port, wait_until

# RFC 3339's date-time (an ISO 8601 profile) with milliseconds, then the rest of the line as
# it always was: "LEVEL logger: message".
TEXT_LINE = re.compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}(?:[+-]\d{2}:\d{2}|Z)) \[(\d+)\] "
    r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) (lameduck[\w.]*): (.*)$")
LEVEL = re.compile(r" (DEBUG|INFO|WARNING|ERROR|CRITICAL) lameduck")

# A wrapper that moves the options from --log-level to --end before the subcommand:
# `python -m lameduck OPTS run ...` (Lameduck.start puts its args after it).
BEFORE = [sys.executable, "-c",
          "import os, sys; a = sys.argv[1:]; i = a.index('run'); j = a.index('--end');"
          " k = a.index('--log-level');"
          " os.execv(a[0], a[:i] + a[k:j] + a[i:k])"]


def log_lines(ld: Lameduck) -> list[str]:
    return [ln for ln in ld.log().splitlines() if LEVEL.search(ln)]


def recent(stamp: str) -> bool:
    t = datetime.fromisoformat(stamp)
    return t.tzinfo is not None and abs(datetime.now(t.tzinfo) - t) < timedelta(minutes=5)


def dead_config(**over: Any) -> tuple[dict[str, Any], str]:
    """One cluster whose only endpoint refuses every connection, no retries."""
    dead = f"127.0.0.1:{refusing_port()}"
    cfg = base_config(0, cluster={"endpoints": [dead], "retry_policy": {"num_retries": 0}},
                      **over)
    return cfg, dead


def test_text_lines_start_with_an_iso_8601_time_with_date_and_zone(
        tmp_path: Path, origin_port: int) -> None:
    ld = Lameduck(base_config(origin_port), tmp_path).start()
    try:
        assert httpx.get(ld.url("/"), timeout=5).status_code == 200
    finally:
        ld.kill()
    lines = log_lines(ld)
    assert lines, ld.log()
    for ln in lines:
        m = TEXT_LINE.match(ln)
        assert m is not None, ln
        assert recent(m.group(1)), ln
        assert m.group(2) == str(ld.proc.pid), ln  # the pid of the process that wrote it


@pytest.mark.parametrize("to_file", [False, True])
def test_json_lines_parse(tmp_path: Path, to_file: bool) -> None:
    cfg, dead = dead_config()
    log_file = tmp_path / "json.log"
    args = ("--log-format", "json") + (("--log-file", str(log_file)) if to_file else ())
    ld = Lameduck(cfg, tmp_path).start(args=args)
    try:
        assert httpx.get(ld.url("/"), timeout=5).status_code == 503

        def text() -> str:
            return log_file.read_text() if to_file else ld.log()

        assert wait_until(lambda: "connect failure" in text()), text()
    finally:
        ld.kill()
    # on stderr the start-up banner (not a log line) is there too
    records = [json.loads(ln) for ln in text().splitlines() if ln.startswith("{")]
    assert len(records) >= 2, text()
    for r in records:
        assert set(r) == {"time", "level", "logger", "message", "pid"}, r
        assert r["pid"] == ld.pid and r["logger"].startswith("lameduck"), r
        assert recent(r["time"]), r
    warned = [r for r in records if "connect failure" in r["message"]]
    assert warned and warned[0]["level"] == "WARNING" and dead in warned[0]["message"]
    if to_file:
        assert not any(ln.startswith("{") for ln in ld.log().splitlines()), ld.log()


@pytest.mark.parametrize("before", [True, False], ids=["before-run", "after-run"])
def test_log_level_before_or_after_the_subcommand(tmp_path: Path, before: bool) -> None:
    cfg, dead = dead_config()
    quiet = Lameduck(cfg, tmp_path).start(
        args=("--log-level", "warning", "--log-format", "json", *(["--end"] if before else [])),
        wrapper=BEFORE if before else None)
    loud = Lameduck(dead_config()[0], tmp_path).start()  # the default: info, text
    try:
        for ld in (quiet, loud):
            assert httpx.get(ld.url("/"), timeout=5).status_code == 503
            assert wait_until(lambda ld=ld: "connect failure" in ld.log()), ld.log()
    finally:
        quiet.kill()
        loud.kill()
    assert any(" INFO lameduck" in ln for ln in log_lines(loud)), loud.log()
    records = [json.loads(ln) for ln in quiet.log().splitlines() if ln.startswith("{")]
    assert records and {r["level"] for r in records} == {"WARNING"}, quiet.log()
    assert any(dead in r["message"] for r in records), records  # (after config warnings)


def test_a_dead_origin_makes_at_most_two_lines_for_200_requests(tmp_path: Path) -> None:
    cfg, dead = dead_config()
    ld = Lameduck(cfg, tmp_path).start(args=("--upstream-error-log-every", "5s"))
    try:
        with httpx.Client(timeout=5) as client:
            for _ in range(200):
                assert client.get(ld.url("/")).status_code == 503
        failed = ld.stat("cluster.app.upstream_cx_connect_fail")
        # the rest are counted in one line when the window ends
        assert wait_until(lambda: "more in the last" in ld.log(), timeout=15), ld.log()
    finally:
        ld.kill()
    about = [ln for ln in log_lines(ld) if dead in ln]
    assert all(" WARNING lameduck.upstream: " in ln for ln in about), about
    assert len(about) <= 2, about
    first, summary = about
    assert first.endswith(f"upstream connect failure: cluster app endpoint {dead}"), first
    m = re.search(r"connect failure: cluster app endpoint \S+: (\d+) more in the last", summary)
    assert m is not None, summary
    assert failed >= 200 and 1 + int(m.group(1)) == failed, (failed, summary)


def test_supervise_children_log_as_told(tmp_path: Path, origin_port: int) -> None:
    """The supervisor puts its log options before `run` on each child's command line."""
    ld = Lameduck(base_config(origin_port), tmp_path).start(
        command="supervise", args=("--log-format", "json"))
    try:
        assert httpx.get(ld.url("/"), timeout=5).status_code == 200
    finally:
        ld.kill()
    records = [json.loads(ln) for ln in ld.log().splitlines() if ln.startswith("{")]
    assert {r["pid"] for r in records} - {ld.pid}, ld.log()  # a child's lines too
    assert not log_lines(ld), ld.log()  # no text line from anyone
