"""``lameduck prestop --leave confirm`` with real peers: a prober loop on the health-check path
(what HAProxy's ``option httpchk`` does: a new connection per check, every 200 ms, from
127.0.0.1) and a direct client from 127.0.0.2 that never probes.

The bound (``--lb-buffer 30s``) is far: a preStop that ends by confirmation ends before it, and
its reason says so; the assertions are on order (the prober had fallen, the client had stopped)
and on which of the two ended CLOSING, never on how long anything took.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from tests.procs import Lameduck, _env, wait_until

pytestmark = pytest.mark.usefixtures("workers")

HEALTH = "/health_check.html"


def get(addr: str, path: str, source: str) -> int:
    """One HTTP/1.1 GET on a new connection from ``source`` (a loopback address): the status,
    0 when the connection failed."""
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5,
                                      source_address=(source, 0)) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while b"\r\n\r\n" not in data and (chunk := s.recv(4096)):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length and (chunk := s.recv(4096)):
                body += chunk
        return int(head.split(b" ", 2)[1])
    except (OSError, ValueError, IndexError):
        return 0


class Loop(threading.Thread):
    """GET ``path`` from ``source`` every ``every`` seconds until ``stop()``; each answer's
    (monotonic time, status) in ``answers``."""

    def __init__(self, addr: str, path: str, source: str, every: float) -> None:
        super().__init__(daemon=True)
        self.addr, self.path, self.source, self.every = addr, path, source, every
        self.answers: list[tuple[float, int]] = []
        self.halt = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.halt.is_set():
            status = get(self.addr, self.path, self.source)
            self.answers.append((time.monotonic(), status))
            self.halt.wait(self.every)

    def stop(self) -> float:
        self.halt.set()
        self.join(10)
        return time.monotonic()

    def failing(self) -> int:
        return sum(1 for _, s in self.answers if s and not 200 <= s < 300)


def start(ld: Lameduck) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "lameduck", "prestop", "--admin", ld.admin_addr,
           "--leave", "confirm", "--strategy", "deregister-first", "--lb-buffer", "30s",
           "--drain-timeout", "5s"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())


def prestop(ld: Lameduck) -> dict[str, Any]:
    return ld.server_info()["prestop"]  # type: ignore[no-any-return]


def closing_end(summary: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in summary["transitions"] if t["from"] == "CLOSING")


def test_confirm_leaves_after_the_probers_fall_well_before_the_bound(lameduck) -> None:
    ld = lameduck(listener={"lb_probes": {"fall": 3}})
    prober = Loop(ld.addr, HEALTH, "127.0.0.1", 0.2)
    proc = None
    try:
        assert wait_until(lambda: len(prober.answers) >= 4, 10)  # its interval is learned
        proc = start(ld)
        out, err = proc.communicate(timeout=60)
    finally:
        prober.stop()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    end = closing_end(summary)
    assert end["to"] == "DRAINING"
    assert end["reason"].startswith("lb converged (confirm): prober 127.0.0.1 fell at "), end
    assert end["after"] < 30.0 and summary["confirmed_after"] < 30.0
    assert summary["leave"] == "confirm"
    assert prober.failing() >= 3
    log = ld.log()
    assert "prestop: lb converged (confirm): prober 127.0.0.1 fell at" in log
    info = ld.server_info()["listeners"][0]["lb_probes"]
    assert info["probers"][0]["address"] == "127.0.0.1"
    assert info["probers"][0]["fell_ago"] is not None


def test_confirm_waits_for_a_direct_client_to_be_quiet(lameduck) -> None:
    ld = lameduck(listener={"lb_probes": {"fall": 3, "quiet": "1s"}})
    prober = Loop(ld.addr, HEALTH, "127.0.0.1", 0.2)
    client = Loop(ld.addr, "/", "127.0.0.2", 0.1)
    proc: subprocess.Popen[str] | None = None
    try:
        assert wait_until(lambda: len(prober.answers) >= 4 and client.answers, 10)
        proc = start(ld)
        # The prober falls; the client goes on: CLOSING waits, naming the client.
        assert wait_until(lambda: prober.failing() >= 3, 20)
        seen: dict[str, Any] = {}

        def awaiting_client() -> bool:
            seen.update(prestop(ld))
            return any("still arriving from 127.0.0.2" in a for a in seen.get("awaiting", []))

        assert wait_until(awaiting_client, 20), seen
        held = prober.failing()
        assert wait_until(lambda: prober.failing() >= held + 5, 20)  # a second on, still:
        view = prestop(ld)
        assert view["state"] == "CLOSING", view
        assert any("127.0.0.2" in a for a in view["awaiting"]), view
        stopped = client.stop()
        out, err = proc.communicate(timeout=60)
        done = time.monotonic()
    finally:
        prober.stop()
        client.stop()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    end = closing_end(summary)
    assert end["reason"].startswith("lb converged (confirm): prober 127.0.0.1 fell at "), end
    assert stopped < done
    assert "lb_buffer elapsed" not in ld.log()


def test_sigterm_with_shutdown_leave_confirm_exits_once_the_prober_fell(lameduck,
                                                                        tmp_path) -> None:
    """``shutdown.leave: confirm``: min_drain (30 s here) is only the bound; the exit comes
    once the prober has fallen (and the process is idle). The drain report records it, for
    ``lameduck budget``."""
    reports = tmp_path / "reports"
    ld = lameduck(listener={"lb_probes": {"fall": 3}}, drain={"report_dir": str(reports)},
                  shutdown={"deadline": "40s", "min_drain": "30s", "leave": "confirm"})
    prober = Loop(ld.addr, HEALTH, "127.0.0.1", 0.2)
    try:
        assert wait_until(lambda: len(prober.answers) >= 4, 10)
        ld.signal(signal.SIGTERM)
        code = ld.wait(60)
    finally:
        prober.stop()
    assert code == 0
    assert prober.failing() >= 3
    log = ld.log()
    assert "shutdown: lb converged (confirm) after" in log, log
    assert "prober 127.0.0.1 fell at" in log
    assert "min_drain elapsed before the LB was seen to stop" not in log
    (report,) = reports.glob("drain-*.json")
    leave = json.loads(report.read_text())["leave"]
    assert leave["by"] == "shutdown" and leave["bound"] == 30.0
    assert 0 < leave["confirmed_after"] < 30.0


def test_an_unknown_leave_is_refused_and_nothing_starts(lameduck) -> None:
    ld = lameduck()
    r = ld.admin("POST", "/prestop?strategy=deregister-first&leave=soon")
    assert r.status_code == 400 and "unknown leave 'soon'" in r.text
    assert prestop(ld) == {"state": "SERVING"}
