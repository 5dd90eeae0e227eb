"""One instance taken out of a fleet under load, measured end to end: HAProxy (the Debian
package, tests/haproxy.py) health-checking two lameducks, each in front of its own demo origin;
real clients through HAProxy; ``lameduck prestop`` on lameduck #1, then the SIGTERM a kubelet
sends once the preStop hook has returned (Kubernetes, "Pod termination": the hook runs first,
then TERM), and the load goes on until HAProxy has marked that server DOWN and the other one
has answered more.

What is measured, each on the one monotonic clock of the machine (Linux's CLOCK_MONOTONIC is
system-wide: lameduck's event loop, HAProxy's stats polled here and the clients share it):

- when HAProxy marked the server DOWN: its stats socket (``show stat``, the status column:
  ``UP``, ``UP 2/3`` once a check failed, ``DOWN``) polled every 20 ms in a thread, each change
  kept with the window it happened in (the poll before, which still saw the old status, and
  the poll that saw the new one);
- when the preStop FSM started (``/server_info``'s ``prestop.elapsed`` read once it runs,
  bracketed by the read's own send and receive times) and its transitions, from the JSON
  summary ``lameduck prestop`` prints;
- every failed request (HAProxy's 5xx, a reset or refused connection, a timeout), with its
  time: tests/loadgen.py's keep-alive and new-connection clients.

Used by tests/integration/test_lb_confirm.py and bench/leave.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import loadgen
from tests.haproxy import Haproxy, ensure_haproxy
from tests.procs import Lameduck, Origin, RawConn, _env, base_config, start_named_origin

HEALTH = "/health_check.html"
# HAProxy's check: every 300 ms; 3 failed answers in a row mark a server DOWN, 2 good ones UP
# (``default-server inter 300ms fall 3 rise 2``). The nominal detection time is 3 x 300 ms
# counted from the check before the health check turned 503, so 0.6 s to 0.9 s after it.
INTER = 0.3
FALL = 3
RISE = 2


def has_leave_flag() -> bool:
    """Whether this tree's ``lameduck prestop`` takes ``--leave`` (the evidence-based leave
    rule): the feature check of the tests written for it before it exists."""
    r = subprocess.run([sys.executable, "-m", "lameduck", "prestop", "--help"],
                       capture_output=True, text=True, env=_env(), timeout=60, check=False)
    return "--leave" in r.stdout


# -- HAProxy's view, polled ----------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """A server's status changed between two polls of the stats socket: after ``before`` (when
    the poll that still saw ``old`` was sent) and before ``seen`` (when the poll that saw
    ``status`` had its answer)."""

    server: str
    old: str | None
    status: str
    before: float
    seen: float


class StateWatch(threading.Thread):
    """Polls HAProxy's ``show stat`` every ``every`` seconds until ``stop()`` or ``timeout``,
    and keeps each change of each server's status. A poll that fails (HAProxy busy, the
    socket not answering) is skipped: the next one carries the window on."""

    def __init__(self, h: Haproxy, every: float = 0.02, timeout: float = 120.0) -> None:
        super().__init__(daemon=True)
        self.h = h
        self.every = every
        self.timeout = timeout
        self.changes: list[Change] = []
        self.polls = 0
        self.errors = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        end = time.monotonic() + self.timeout
        last: dict[str, str] = {}
        last_sent: float | None = None
        while not self._halt.is_set() and time.monotonic() < end:
            sent = time.monotonic()
            try:
                states = self.h.server_states()
            except (OSError, RuntimeError):
                self.errors += 1
                self._halt.wait(self.every)
                continue
            got = time.monotonic()
            self.polls += 1
            with self._lock:
                for server, status in states.items():
                    if last.get(server) != status:
                        self.changes.append(Change(server, last.get(server), status,
                                                   last_sent if last_sent is not None else sent,
                                                   got))
            last = states
            last_sent = sent
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def first(self, server: str, status: str, after: float = 0.0) -> Change | None:
        """The first change of ``server`` to ``status`` seen after ``after``."""
        with self._lock:
            return next((c for c in self.changes
                         if c.server == server and c.status == status and c.seen >= after),
                        None)

    def history(self, server: str, since: float) -> list[str]:
        """``server``'s statuses seen from ``since``, with their times from it, for a report."""
        with self._lock:
            return [f"{c.seen - since:+.3f}s {c.status}" for c in self.changes
                    if c.server == server and c.seen >= since]


# -- a second prober ---------------------------------------------------------------------------


class Prober(threading.Thread):
    """Another load balancer probing the same health-check path: a ``GET`` on a new connection
    from ``source`` (a loopback address of its own, so lameduck tells it from HAProxy's checks
    by its peer address) every ``every`` seconds, until ``stop()`` or ``timeout``.
    ``answers``: (monotonic time, status or 0 for no answer)."""

    def __init__(self, addr: str, path: str = HEALTH, source: str = "127.0.0.2",
                 every: float = 2.0, timeout: float = 120.0) -> None:
        super().__init__(daemon=True)
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self.path = path
        self.source = source
        self.every = every
        self.timeout = timeout
        self.answers: list[tuple[float, int]] = []
        self.local: str | None = None  # the address its last probe went from
        self._halt = threading.Event()

    def probe(self) -> int:
        with socket.socket() as s:
            s.settimeout(5)
            s.bind((self.source, 0))
            s.connect((self.host, self.port))
            self.local = s.getsockname()[0]
            s.sendall(f"GET {self.path} HTTP/1.1\r\nHost: {self.host}\r\n"
                      "Connection: close\r\n\r\n".encode())
            head = b""
            while b"\r\n" not in head:
                data = s.recv(4096)
                if not data:
                    break
                head += data
        return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0

    def run(self) -> None:
        end = time.monotonic() + self.timeout
        while not self._halt.is_set() and time.monotonic() < end:
            try:
                status = self.probe()
            except (OSError, ValueError, IndexError):
                status = 0
            self.answers.append((time.monotonic(), status))
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


# -- the fleet ---------------------------------------------------------------------------------


@dataclass
class Fleet:
    origins: list[Origin]
    lameducks: list[Lameduck]
    haproxy: Haproxy


@contextlib.contextmanager
def fleet(workdir: Path, listener: dict[str, Any] | None = None,
          check_traceback: bool = True) -> Iterator[Fleet]:
    """Two demo origins (``o1``, ``o2``), a lameduck in front of each (tests/procs.py's
    ``base_config``; ``listener``: more keys for its listener), and HAProxy in front of both
    (servers ``s1``, ``s2``), checking ``HEALTH`` with ``inter 300ms fall 3 rise 2``. Both
    servers are UP when it yields; everything is stopped by pid after."""
    ensure_haproxy()
    workdir.mkdir(parents=True, exist_ok=True)
    origins: list[Origin] = []
    lds: list[Lameduck] = []
    h: Haproxy | None = None
    try:
        for name in ("o1", "o2"):
            origins.append(start_named_origin(name))
        for o in origins:
            cfg = base_config(o.port, listener=dict(listener or {}))
            ld = Lameduck(cfg, workdir)
            lds.append(ld)
            ld.start()
        h = Haproxy([ld.port for ld in lds], workdir / "haproxy", path=HEALTH,
                    interval=INTER, fall=FALL, rise=RISE)
        for s in h.servers:
            if h.wait_state(s, "UP", timeout=30) is None:
                raise RuntimeError(f"{s} not UP: {h.server_states()}\n{h.log()}")
        yield Fleet(origins, lds, h)
    finally:
        if h is not None:
            h.stop()
        for ld in lds:
            ld.kill()
        for o in origins:
            o.close()
    if check_traceback:
        # a traceback in lameduck's log is a bug even if every client got its answer
        for ld in lds:
            assert "Traceback" not in ld.log(), ld.log()


# -- one instance out, under load --------------------------------------------------------------


@dataclass
class Leave:
    """What one run of ``run_leave`` saw; times are monotonic seconds."""

    name: str
    prestop_args: list[str]
    rc: int = -1  # lameduck prestop's exit code
    summary: dict[str, Any] = field(default_factory=dict)  # its JSON summary
    stderr: str = ""  # its transition lines
    start_lo: float = 0.0  # the FSM started between these two (its POST /prestop)
    start_hi: float = 0.0
    down: Change | None = None  # HAProxy marked the server DOWN
    prestop_exited: float = 0.0
    sigterm_at: float = 0.0
    exited: float = 0.0  # lameduck #1 gone
    exit_code: int | None = None
    counts: loadgen.Counts = field(default_factory=loadgen.Counts)
    load_seconds: float = 0.0
    history: list[str] = field(default_factory=list)  # the server's statuses in HAProxy
    log: str = ""  # lameduck #1's log

    @property
    def start(self) -> float:
        return (self.start_lo + self.start_hi) / 2

    @property
    def requests(self) -> int:
        return self.counts.ok + self.counts.failed

    def after(self, source: str, target: str) -> float | None:
        """When the FSM went ``source`` -> ``target``, in seconds from its start."""
        for t in self.summary.get("transitions", []):
            if (t["from"], t["to"]) == (source, target):
                return float(t["after"])
        return None

    @property
    def closing(self) -> float | None:
        """How long the instance stayed out of rotation before its drain began (deregister-
        first: CLOSING from the start to CLOSING -> DRAINING)."""
        return self.after("CLOSING", "DRAINING")

    @property
    def down_after(self) -> float | None:
        """When HAProxy marked the server DOWN, from the FSM's start (the poll that saw it)."""
        return None if self.down is None else self.down.seen - self.start

    @property
    def closing_past_down(self) -> float | None:
        """The most CLOSING can have ended after HAProxy marked the server DOWN: its end at
        the latest the FSM can have started, from the earliest DOWN can have been."""
        if self.down is None or self.closing is None:
            return None
        return self.start_hi + self.closing - self.down.before

    @property
    def drained_by_response(self) -> int | None:
        """Connections lameduck #1 closed after a response said ``Connection: close``, as its
        drain report at the exit counts them: HAProxy's, which it keeps sending on until DOWN
        (from the health check's failure on, every response closes its connection)."""
        m = re.search(r"drain report: .* connections drained by response=(\d+)", self.log)
        return int(m.group(1)) if m else None

    def failures_from_start(self) -> list[float]:
        return [round(t - self.start, 3) for t in self.counts.failed_at]

    def row(self) -> str:
        def s(v: float | None) -> str:
            return "-" if v is None else f"{v:.3f}"

        return (f"{self.name:<10} CLOSING {s(self.closing)}s, HAProxy DOWN after "
                f"{s(self.down_after)}s, prestop rc {self.rc}, exit {s(self.exited - self.start)}s"
                f" after the start; {self.drained_by_response} connections drained by response;"
                f" {self.requests} requests, {self.counts.failed} failed "
                f"({self.counts.refused} refused, {self.counts.errors} errors, "
                f"{self.counts.bad_status} bad status)")


def admin_query(prestop_args: list[str]) -> str:
    """``lameduck prestop``'s options as ``POST /prestop``'s query: ``--lb-buffer 2s`` ->
    ``lb_buffer=2s`` (the command sends the same)."""
    pairs = []
    for flag, value in zip(prestop_args[::2], prestop_args[1::2], strict=True):
        if not flag.startswith("--"):
            raise ValueError(f"not an option: {flag!r} in {prestop_args}")
        pairs.append(f"{flag[2:].replace('-', '_')}={value}")
    return "&".join(pairs)


def _prestop_view(conn: RawConn) -> tuple[float, float, dict[str, Any]]:
    sent = time.monotonic()
    body = json.loads(conn.request("/server_info").body)
    return sent, time.monotonic(), body.get("prestop", {})


SIGTERM_ON = ("closed", "hook")


def run_leave(f: Fleet, name: str, prestop_args: list[str], *, sigterm_on: str = "closed",
              warmup: int = 300, after: int = 300, total: int = 2000, bound: float = 90.0,
              keepalive: int = 4, fresh: int = 2) -> Leave:
    """Under load through HAProxy: the preStop FSM on lameduck #1 (server ``s1``) with
    ``lameduck prestop``'s options ``prestop_args``, then SIGTERM to it, then the load goes
    on until HAProxy has marked ``s1`` DOWN, ``after`` more requests were answered and
    ``total`` requests were sent in all. Every step is bounded: ``bound`` seconds at most
    for the command, the exit, the wait for DOWN and the wait for the answers, each.
    ``warmup``: answers before the prestop starts (both servers serving). The load:
    loadgen's ``keepalive`` keep-alive clients and ``fresh`` clients opening a connection per
    request, 200 000 requests each at most, 10 minutes at most; a request stuck in HAProxy's
    connect retries (3, a second apart, to a server that has gone) is waited for, and
    counted, before the load stops.

    ``sigterm_on="closed"``: the FSM started with ``POST /prestop`` (the same options as a
    query) and the SIGTERM sent as soon as ``/server_info`` (polled every 10 ms) says CLOSED:
    what the leave rule alone gives, as a hook that returns the moment the FSM ends would.
    ``"hook"``: ``lameduck prestop`` run as a preStop hook is, and the SIGTERM sent once it has
    exited; its own polling (every 100 ms) and a Python process's exit come on top."""
    if sigterm_on not in SIGTERM_ON:
        raise ValueError(f"sigterm_on: {sigterm_on!r} is not one of {SIGTERM_ON}")
    h = f.haproxy
    victim = f.lameducks[0]
    run = Leave(name, prestop_args)
    watch = StateWatch(h, timeout=bound * 4)
    watch.start()
    stop = threading.Event()
    counts = run.counts

    def load() -> None:
        t = time.monotonic()
        asyncio.run(loadgen.run(h.port, 600, keepalive=keepalive, fresh=fresh, limit=200_000,
                                stop=stop, counts=counts))
        run.load_seconds = time.monotonic() - t

    loader = threading.Thread(target=load, daemon=True)
    proc: subprocess.Popen[str] | None = None
    admin = RawConn(victim.admin_addr, timeout=10)
    try:
        loader.start()
        if not _wait(lambda: counts.ok >= warmup, bound):
            raise RuntimeError(f"{name}: no steady load ({counts}): {h.log()}")
        end = time.monotonic() + bound
        if sigterm_on == "hook":
            proc = subprocess.Popen(
                [sys.executable, "-m", "lameduck", "prestop", "--admin", victim.admin_addr,
                 *prestop_args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=_env())
            while True:
                sent, got, view = _prestop_view(admin)
                if view.get("state", "SERVING") != "SERVING":
                    break
                if time.monotonic() > end or proc.poll() is not None:
                    raise RuntimeError(f"{name}: the prestop did not start: {proc.poll()}")
                time.sleep(0.01)
        else:
            sent = time.monotonic()
            r = admin.request(f"/prestop?{admin_query(prestop_args)}", "POST",
                              {"Content-Length": "0"})
            got = time.monotonic()
            if r.status != 200:
                raise RuntimeError(f"{name}: POST /prestop: {r.status} {r.body!r}")
            view = json.loads(r.body)
        # elapsed = the view's now - the FSM's start, and sent <= now <= got
        run.start_lo, run.start_hi = sent - view["elapsed"], got - view["elapsed"]
        if proc is not None:
            out, run.stderr = proc.communicate(timeout=bound)
            run.prestop_exited = time.monotonic()
            run.rc = proc.returncode
            run.summary = json.loads(out)
        else:
            while view.get("state") != "CLOSED":
                if time.monotonic() > end:
                    raise RuntimeError(f"{name}: the prestop did not end: {view}")
                time.sleep(0.01)
                view = _prestop_view(admin)[2]
            run.prestop_exited = time.monotonic()
            run.rc = 3 if view.get("timed_out") else 0  # as lameduck prestop would exit
            run.summary = view
        # what a kubelet does once the preStop hook has returned
        run.sigterm_at = time.monotonic()
        victim.signal(signal.SIGTERM)
        run.exit_code = victim.wait(bound)
        run.exited = time.monotonic()
        _wait(lambda: watch.first("s1", "DOWN", run.start_lo) is not None, bound)
        ok = counts.ok
        _wait(lambda: counts.ok >= ok + after and counts.ok + counts.failed >= total, bound)
    finally:
        admin.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
        stop.set()
        loader.join(60)
        watch.stop()
    run.down = watch.first("s1", "DOWN", run.start_lo)
    run.history = watch.history("s1", run.start)
    run.log = victim.log()
    return run


def _wait(pred: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= end:
            return False
        time.sleep(0.01)
    return True
