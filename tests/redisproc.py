"""A real ``redis-server`` for the tests: a child process on a Unix socket of its own, no
persistence, stopped by pid. Installed from Debian (scripts/ensure-debs.sh) when missing.

A Unix socket, not TCP: redis-server cannot bind an ephemeral port (``--port 0`` turns TCP off)
and so cannot report one, and a port picked for it beforehand could be taken by a test running
in parallel. A socket path under the test's own directory is never contended."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.procs import ensure_command, stop


def ensure_redis() -> None:
    ensure_command("redis-server", "redis-server")


# sun_path holds 108 bytes with its terminating NUL (unix(7))
MAX_SOCKET_PATH = 107


class RedisServer:
    """``redis-server`` on the Unix socket ``workdir/redis.sock`` (TCP off), in ``workdir``,
    without RDB or AOF."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.sock = workdir / "redis.sock"
        if len(str(self.sock)) > MAX_SOCKET_PATH:  # a deep tmp dir: a short one of its own
            self.sock = Path(tempfile.mkdtemp(prefix="redis-")) / "redis.sock"
        self.log_path = workdir / "redis.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> RedisServer:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", "0", "--unixsocket", str(self.sock),
                 "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                 "--dir", str(self.workdir)],
                stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited early:\n{self.log()}")
            if self.ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server not ready within {timeout}s:\n{self.log()}")

    def ping(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1)
                s.connect(str(self.sock))
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def url(self) -> str:
        return f"unix://{self.sock}?db=0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
        if self.sock.parent != self.workdir:
            shutil.rmtree(self.sock.parent, ignore_errors=True)
