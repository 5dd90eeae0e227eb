"""A real ``redis-server`` for the tests: a child process on a free loopback port, no
persistence, stopped by pid. Installed from Debian (scripts/ensure-debs.sh) when missing."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tests.procs import ensure_command, free_port, stop


def ensure_redis() -> None:
    ensure_command("redis-server", "redis-server")


class RedisServer:
    """``redis-server`` bound to 127.0.0.1 on a free port, in ``workdir``, without RDB or AOF."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.port = free_port()
        self.log_path = workdir / "redis.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> RedisServer:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                 "--protected-mode", "no"],
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
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
