"""``lameduck top`` against a real lameduck: the plain-text snapshot a pipe gets, the one-line
error of an unreachable admin API, and the live view in a real terminal (tmux) following a
SIGTERM drain to the process's exit, then Ctrl-C.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.procs import (
    SRC,
    Lameduck,
    _env,
    ensure_command,
    refusing_port,
    unique,
    wait_until,
)

TOP = [sys.executable, "-m", "lameduck", "top"]


def slow_request(ld: Lameduck, ms: int) -> threading.Thread:
    """A GET the origin answers after ``ms``, in a thread (its outcome is not the point)."""
    def run() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(ld.url(f"/sleep?ms={ms}"), timeout=ms / 1000 + 10)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_snapshot_when_stdout_is_not_a_terminal(lameduck: Callable[..., Lameduck]) -> None:
    ld = lameduck()
    # far longer than the snapshot takes: a loaded machine took 4 s from the start to it, and
    # the endpoint's row showed the request ended while the listener's still had it
    slow_request(ld, 30_000)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1, timeout=30)
    r = subprocess.run([*TOP, "--admin-address-path", str(ld.admin_path)], capture_output=True,
                       text=True, env=_env(), timeout=20)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "\x1b" not in out  # plain text: no colour, no cursor movement
    assert re.search(r"^state\s+LIVE\b", out, re.M), out
    assert "in flight: requests 1, connections 1" in out, out
    # the listener's row: name, bound address, OPEN, cx_active 1, rq_active 1
    row = re.search(rf"^ingress\s+{re.escape(ld.addr)}\s+OPEN\s+(\d+)\s+(\d+)\s", out, re.M)
    assert row is not None, out
    assert row.groups() == ("1", "1"), out
    # the endpoint's row: READY and UP, rq_active 1
    ep = re.search(r"^app\s+127\.0\.0\.1:\d+\s+READY\s+UP\s+\d+\s+\d+\s+(\d+)\s", out, re.M)
    assert ep is not None and ep.group(1) == "1", out
    assert "drain     none yet (drain.time 2s, gradual)" in out, out


def test_unreachable_admin_is_one_line_and_exit_2() -> None:
    r = subprocess.run([*TOP, "--once", "--admin", f"127.0.0.1:{refusing_port()}"],
                       capture_output=True, text=True, env=_env(), timeout=20)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lameduck top: admin API unreachable: "), \
        r.stderr


class Tmux:
    """A tmux server of its own (``-L``: not the user's, not another test's), killed at the
    end with every session and process in it."""

    def __init__(self) -> None:
        ensure_command("tmux", "tmux")
        self.socket = f"lameduck-top-{unique()}"
        self.session = "top"

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True,
                              text=True, check=True, timeout=10).stdout

    def capture(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.session)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=10, check=False)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    t = Tmux()
    try:
        yield t
    finally:
        t.kill()


def test_live_view_follows_a_drain_and_quits_on_ctrl_c(lameduck: Callable[..., Lameduck],
                                                      tmux: Tmux) -> None:
    # T 3 s; a 4 s request keeps the drain (and the process) going past T
    ld = lameduck(drain={"time": "3s", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "6s"})
    # the pane's own size, not COLUMNS / LINES the test process may carry (rich prefers them)
    cmd = (f"env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(str(SRC))} "
           f"{shlex.quote(sys.executable)} -m lameduck top --admin {ld.admin_addr}; "
           "echo EXITED $?; sleep 30")
    tmux.run("new-session", "-d", "-s", tmux.session, "-x", "160", "-y", "50", cmd)
    assert wait_until(lambda: re.search(r"^state\s+LIVE", tmux.capture(), re.M) is not None,
                      timeout=10, interval=0.05), tmux.capture()
    slow_request(ld, 4000)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1, timeout=5)
    ld.signal(signal.SIGTERM)

    seen: list[float] = []

    def elapsed_moves() -> bool:
        screen = tmux.capture()
        m = re.search(r"^elapsed\s+([\d.]+)s", screen, re.M)
        draining = re.search(r"^state\s+DRAINING", screen, re.M) is not None
        if m and draining and (not seen or float(m.group(1)) != seen[-1]):
            seen.append(float(m.group(1)))
        return len(seen) >= 2

    assert wait_until(elapsed_moves, timeout=5, interval=0.05), tmux.capture()
    assert seen[1] > seen[0]
    screen = tmux.capture()
    assert "\x1b" not in screen
    # HAProxy's word; the whole address: the view has the pane's 160 columns
    assert re.search(rf"^ingress\s+{re.escape(ld.addr)}\s+DRAIN\s", screen, re.M), screen

    # the drain ends (the request done, T passed): the process exits; the view stays, retrying
    assert ld.wait(timeout=10) == 0
    assert wait_until(lambda: "admin API unreachable (retrying)" in tmux.capture(), timeout=5,
                      interval=0.05), tmux.capture()
    assert re.search(r"^state\s+DRAINING", tmux.capture(), re.M)  # the last numbers stay

    tmux.run("send-keys", "-t", tmux.session, "C-c")
    assert wait_until(lambda: "EXITED" in tmux.capture(), timeout=5, interval=0.05), \
        tmux.capture()
    assert "EXITED 0" in tmux.capture(), tmux.capture()
    # the alternate screen is gone: the shell's line is what the pane shows, not the view
    assert "drain counters" not in tmux.capture()
