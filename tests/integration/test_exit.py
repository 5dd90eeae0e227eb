"""The exit after a drain ends the process at once (os._exit, no interpreter teardown), so what
it owes is written before that: every access-log line (buffered up to 1 s, so the last ones are
written by the exit itself), the drain report's log line and file, and the exit code the docs
promise (0 clean, 3 cut). A cut's 503 still reaches its client although nobody lingers for the
client's FIN any more. How fast the exit is, is bench/exit.py's to measure, not a test's."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.procs import SRC, AdminPoller, Lameduck, RawConn, _env, base_config, wait_until

pytestmark = pytest.mark.usefixtures("workers")

QUICK = [f"/?n={i}" for i in range(5)]
HELD = "/sleep?ms=60000"
# Envoy's default line: [start] "METHOD PATH PROTOCOL" CODE ...
DEFAULT_LINE = re.compile(r'^\[[^]]+\] "GET (\S+) HTTP/1\.1" (\d{3}) ')


def access_lines(text: str) -> dict[str, list[int]]:
    """path → the status of each line logged for it."""
    out: dict[str, list[int]] = {}
    for line in text.splitlines():
        m = DEFAULT_LINE.match(line)
        if m:
            out.setdefault(m[1], []).append(int(m[2]))
    return out


@pytest.mark.parametrize("ending", ["cut", "clean"])
@pytest.mark.parametrize("destination", ["file", "stdout"])
def test_exit_writes_every_access_line_and_the_report_first(lameduck: Any, tmp_path: Path,
                                                            ending: str,
                                                            destination: str) -> None:
    log = tmp_path / "access.log"
    reports = tmp_path / "reports"
    ld: Lameduck = lameduck(
        drain={"time": "100ms", "strategy": "immediate", "connection_grace": "50ms",
               "report_dir": str(reports)},
        # the deadline is far when the exit is clean: the drain ends when the last request has
        shutdown={"deadline": "300ms" if ending == "cut" else "20s"},
        listener={"access_log": {"path": str(log) if destination == "file" else "stdout"}})
    conn = RawConn(ld.addr)
    admin = AdminPoller(ld.admin_addr)
    held = None
    try:
        for path in QUICK:
            assert conn.request(path).status == 200
        if ending == "cut":
            held = RawConn(ld.addr)
            held.send(HELD)
            assert wait_until(lambda: admin.stat("http.ingress.downstream_rq_active") == 1,
                              10, 0)
        admin.close()
        ld.signal(signal.SIGTERM)
        if held is not None:
            assert held.read_response().status == 503  # sent, and not lost at the exit
        code = ld.wait(60)
    finally:
        conn.close()
        if held is not None:
            held.close()
    assert code == (3 if ending == "cut" else 0), ld.log()

    out = ld.log()  # stdout and stderr
    lines = access_lines(log.read_text() if destination == "file" else out)
    expect = {path: [200] for path in QUICK}
    if ending == "cut":
        expect[HELD] = [503]
    assert lines == expect, out

    [report_file] = reports.glob("drain-*.json")
    report = json.loads(report_file.read_text())
    assert report["pid"] == ld.pid and report["shutdown"]
    assert report["counts"]["cut"] == (1 if ending == "cut" else 0)
    said = [ln for ln in out.splitlines() if " lameduck: " in ln]  # the process log
    [line] = [ln for ln in said if " drain report: " in ln]
    assert f" cut={report['counts']['cut']} " in line, out
    assert said[-1].endswith(f"drain report written to {report_file}"), out


def test_the_exit_skips_the_interpreter_teardown(origin_port: int, tmp_path: Path) -> None:
    """Seen from inside, without a clock: an atexit handler (installed in every process by a
    sitecustomize) runs in the interpreter's teardown, so it must not run in lameduck's
    processes (the main one and any worker) after a drain; it does for a command that ends
    the ordinary way (validate), which shows the handler is installed."""
    hook = tmp_path / "hook"
    hook.mkdir()
    marks = tmp_path / "teardowns"
    (hook / "sitecustomize.py").write_text(
        "import atexit, os\n"
        f"atexit.register(lambda: open({str(marks)!r}, 'a').write(f'{{os.getpid()}}\\n'))\n")
    env = {"PYTHONPATH": os.pathsep.join([str(hook), str(SRC)])}
    ld = Lameduck(base_config(origin_port), tmp_path).start(env=env)
    try:
        conn = RawConn(ld.addr)
        try:
            assert conn.request("/").status == 200
        finally:
            conn.close()
        ld.signal(signal.SIGTERM)
        assert ld.wait(60) == 0, ld.log()
    finally:
        ld.kill()  # (gone already when the test passes)
    assert "Traceback" not in ld.log(), ld.log()
    assert not marks.exists(), marks.read_text()
    done = subprocess.run([sys.executable, "-m", "lameduck", "validate", "-c", str(ld.path)],
                          env={**_env(), **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(marks.read_text().split()) == 1
