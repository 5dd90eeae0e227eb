#!/usr/bin/env python3
"""How long a SIGTERM-ed lameduck takes to be gone: SIGTERM → exit at a 150 ms deadline.

A slow origin (here, in this process: it reads a request and never answers) holds one request
in flight, so the drain must cut it at the deadline. Per run: lameduck starts on a generated
config (``shutdown.deadline: 150ms``, ``drain.time: 100ms``, an access log to a file), one
request is sent and seen arrive at the origin, then SIGTERM; the time to the process's exit is
taken from a pidfd (readable the moment the process is gone, before anyone reaps it), and the
time of its last stderr line as it arrived. Printed per run and as medians over ``--runs``.

What a process owes after its last log line is a flush, not a teardown: the target is the
deadline plus ~20 ms (the issue: exit within 200 ms of SIGTERM at a 150 ms deadline). A
benchmark, not a test: nothing fails; "met" or "NOT met" is printed.

``make bench-exit`` (``.venv/bin/python bench/exit.py --help``); ``--lameduck CMD`` measures
another build, e.g. an installed one: ``--lameduck /usr/local/bin/lameduck``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEADLINE = 0.150
TARGET = 0.200  # SIGTERM → exit, the median of the runs


class HoldingOrigin:
    """Accepts, reads a request head, answers nothing: a request through lameduck to it stays
    in flight until lameduck cuts it. ``arrived`` is set each time a head has come in."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.arrived = threading.Semaphore(0)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in buf:
                data = conn.recv(4096)
                if not data:
                    return
                buf += data
            self.arrived.release()
            while conn.recv(4096):  # until lameduck closes it
                pass


def config(origin_port: int, work: Path, n: int) -> Path:
    cfg = {
        "admin": {"address": "127.0.0.1:0"},
        "hot_restart": {"socket": str(work / f"restart-{n}.sock")},
        "drain": {"time": "100ms", "strategy": "immediate", "connection_grace": "50ms"},
        "shutdown": {"deadline": f"{int(DEADLINE * 1000)}ms",
                     "stop_accepting": "at_drain_end"},
        "listeners": [{
            "name": "ingress", "address": "127.0.0.1:0",
            "access_log": {"path": str(work / f"access-{n}.log")},
            "routes": [{"prefix": "/", "cluster": "slow", "timeout": "30s"}],
        }],
        "clusters": [{"name": "slow", "endpoints": [f"127.0.0.1:{origin_port}"]}],
    }
    path = work / f"lameduck-{n}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass
class Run:
    exit_after: float  # SIGTERM → the process is gone
    last_line_after: float  # SIGTERM → its last stderr line arrived
    code: int
    last_line: str


def listener_port(admin: str) -> int:
    with urllib.request.urlopen(f"http://{admin}/listeners?format=json", timeout=5) as r:
        body = json.load(r)
    return int(body["listener_statuses"][0]["local_address"]["socket_address"]["port_value"])


def one_run(cmd: list[str], origin: HoldingOrigin, work: Path, n: int) -> Run:
    path = config(origin.port, work, n)
    admin_path = work / f"admin-{n}"
    proc = subprocess.Popen([*cmd, "run", "-c", str(path), "--admin-address-path",
                             str(admin_path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            lines.append((time.monotonic(), raw.decode(errors="replace").rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    pidfd = os.pidfd_open(proc.pid)
    client = None
    try:
        end = time.monotonic() + 20
        while not admin_path.exists():
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError("lameduck did not start:\n"
                                   + "\n".join(t for _, t in lines))
            time.sleep(0.01)
        port = listener_port(admin_path.read_text().strip())
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        client.sendall(b"GET /hold HTTP/1.1\r\nHost: bench\r\n\r\n")
        if not origin.arrived.acquire(timeout=10):
            raise RuntimeError("the request never reached the origin")
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        select.select([pidfd], [], [], 30)
        t1 = time.monotonic()
        code = proc.wait(timeout=5)
        reader.join(timeout=5)
    finally:
        os.close(pidfd)
        if client is not None:
            client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if not lines:
        raise RuntimeError("lameduck wrote nothing")
    t_last, last = lines[-1]
    return Run(t1 - t0, t_last - t0, code, last)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--lameduck", default=f"{shlex.quote(sys.executable)} -m lameduck",
                   help="the command to measure (default: this interpreter's -m lameduck)")
    p.add_argument("--src", default=str(ROOT / "src"),
                   help="with -m lameduck: the source tree it runs from (default: this "
                        "checkout's, compiled or not as it is built); another tree for a "
                        "before/after")
    p.add_argument("--json", metavar="OUT", help="the runs as JSON")
    args = p.parse_args()
    cmd = shlex.split(args.lameduck)
    if cmd[1:3] == ["-m", "lameduck"]:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [args.src, os.environ.get("PYTHONPATH")]))
    version = subprocess.run([*cmd, "--version"], capture_output=True, text=True).stdout.strip()
    origin = HoldingOrigin()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="lameduck-bench-exit-") as tmp:
        for n in range(args.runs):
            r = one_run(cmd, origin, Path(tmp), n)
            runs.append(r)
            print(f"run {n + 1:2}: exit {r.exit_after * 1000:6.1f} ms after SIGTERM, "
                  f"last log line at {r.last_line_after * 1000:6.1f} ms "
                  f"(+{(r.exit_after - r.last_line_after) * 1000:5.1f} ms), exit code {r.code}",
                  flush=True)
    med = statistics.median(r.exit_after for r in runs)
    lag = statistics.median(r.exit_after - r.last_line_after for r in runs)
    print(f"\n{version or args.lameduck}: deadline {DEADLINE * 1000:.0f} ms, {len(runs)} runs")
    lo, hi = min(r.exit_after for r in runs), max(r.exit_after for r in runs)
    print(f"SIGTERM -> exit: median {med * 1000:.1f} ms (min {lo * 1000:.1f}, "
          f"max {hi * 1000:.1f}); last log line -> exit: median {lag * 1000:.1f} ms")
    print(f"target: exit within {TARGET * 1000:.0f} ms of SIGTERM (median): "
          + ("met" if med <= TARGET else "NOT met"))
    print(f"exit codes: {sorted({r.code for r in runs})} (3: the deadline cut a request); "
          f"last line: {runs[-1].last_line}")
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in runs], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
