"""At the descriptor limit lameduck keeps serving: with ``ulimit -n`` 128 its downstream cap is
(128 - 32) / 2 = 48 connections. Clients past it are closed at once and counted in
``listener.<name>.downstream_global_cx_overflow``, the log says so once (rate-limited, not one
line per connection), the connections it holds still proxy — their upstream connects find a
descriptor — and once some close, new ones are served again.

Without the cap, accept(2) fails with EMFILE (accept(2): "The per-process limit on the number of
open file descriptors has been reached"): uvloop's libuv then accepts and closes the queued
connections itself, uncounted and unlogged, and upstream connects of held connections fail.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.procs import Lameduck, base_config

NOFILE = 128
CAP = (NOFILE - 32) // 2
CLIENTS = CAP + 30
GET = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"


def _get(s: socket.socket) -> bool:
    """One keep-alive GET on ``s``: True on a 200, False if the server closed it."""
    try:
        s.sendall(GET)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(65536)
            if not chunk:
                return False
            head += chunk
    except OSError:
        return False
    return head.startswith(b"HTTP/1.1 200")


def test_past_the_cap_counted_served_and_recovered(origin_port: int, tmp_path: Path) -> None:
    ld = Lameduck(base_config(origin_port, listener={"idle_timeout": "60s"}), tmp_path)
    ld.start(wrapper=["prlimit", f"--nofile={NOFILE}:{NOFILE}", "--"])
    held: list[socket.socket] = []
    refused = 0
    try:
        for _ in range(CLIENTS):  # bounded: CLIENTS connects, 5 s each at most
            s = socket.create_connection(("127.0.0.1", ld.port), timeout=5)
            if _get(s):
                held.append(s)
            else:
                refused += 1
                s.close()
        assert len(held) == CAP
        assert refused == CLIENTS - CAP
        assert ld.stat("listener.ingress.downstream_global_cx_overflow") == refused
        # The held connections still proxy: a second request each, upstream included.
        assert all(_get(s) for s in held)
        # Free some: new connections are served again.
        for s in held[:10]:
            s.close()
        del held[:10]
        end = time.monotonic() + 5
        served = 0
        while served < 10 and time.monotonic() < end:
            s = socket.create_connection(("127.0.0.1", ld.port), timeout=5)
            if _get(s):
                held.append(s)
                served += 1
            else:
                s.close()
                time.sleep(0.05)
        assert served == 10
        assert ld.proc is not None and ld.proc.poll() is None
    finally:
        for s in held:
            s.close()
        log = ld.log()
        ld.kill()
    assert log.count("downstream connections (RLIMIT_NOFILE") <= 2, log
    assert "EMFILE" not in log and "Too many open files" not in log, log


def test_the_soft_limit_is_raised_to_the_hard_one(origin_port: int, tmp_path: Path) -> None:
    """A soft limit below the hard one (the common 1024 of a login shell or a unit without
    LimitNOFILE=) would cap the clients at (soft - 32) / 2: lameduck takes the hard limit, as
    HAProxy does, and logs it."""
    ld = Lameduck(base_config(origin_port, listener={"idle_timeout": "60s"}), tmp_path)
    ld.start(wrapper=["prlimit", f"--nofile={NOFILE}:{NOFILE * 4}", "--"])
    try:
        limits = Path(f"/proc/{ld.pid}/limits").read_text()
        [line] = [ln for ln in limits.splitlines() if ln.startswith("Max open files")]
        assert line.split()[3:5] == [str(NOFILE * 4), str(NOFILE * 4)], line
        log = ld.log()
        assert (f"RLIMIT_NOFILE: soft limit raised from {NOFILE} to {NOFILE * 4} open files"
                in log), log
        # and the connection cap follows the raised limit: past the old cap of CAP, all served
        held = []
        try:
            for _ in range(CAP + 12):
                s = socket.create_connection(("127.0.0.1", ld.port), timeout=5)
                held.append(s)
                assert _get(s), len(held)
            assert ld.stat("listener.ingress.downstream_global_cx_overflow") == 0
        finally:
            for s in held:
                s.close()
    finally:
        ld.kill()
