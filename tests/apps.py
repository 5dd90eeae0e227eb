"""The demo resume app (lameduck/demo/resume_app.py) under a real ASGI server: uvicorn,
hypercorn or granian, as a child process on a loopback port it binds itself (port 0, read back
from /proc: none of the three prints the port it got), stopped by pid."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from lameduck.resume.store import Session, open_store
from tests.procs import _env, listening_ports, stop

APP = "lameduck.demo.resume_app:app"


def load_sessions(url: str, *tokens: str) -> dict[str, Session]:
    """What the store (``sqlite://…`` or ``redis://…``) holds for each token, read from the
    test's side (a store object of its own)."""
    async def main() -> dict[str, Session]:
        s = open_store(url)
        try:
            return {t: await s.load(t) for t in tokens}
        finally:
            await s.close()
    return asyncio.run(main())


def load_session(url: str, token: str) -> Session:
    return load_sessions(url, token)[token]


def _command(server: str) -> list[str]:
    """The server on 127.0.0.1 port 0."""
    if server == "uvicorn":
        return [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", "0",
                "--log-level", "warning", "--lifespan", "on"]
    if server == "hypercorn":
        return [sys.executable, "-m", "hypercorn", APP, "--bind", "127.0.0.1:0",
                "--workers", "0", "--graceful-timeout", "10"]
    if server == "granian":
        return [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1",
                "--port", "0", "--workers", "1", "--log-level", "warning", APP]
    raise ValueError(server)


class App:
    def __init__(self, server: str, name: str, store: str, workdir: Path, grace: float = 5.0,
                 stagger: float = 0.5, lock_ttl: float = 60.0) -> None:
        self.server = server
        self.name = name
        self.port = 0  # until it listens
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{name}.log"
        env = _env()
        env.update(LAMEDUCK_APP_NAME=name, LAMEDUCK_STORE=store, LAMEDUCK_GRACE=str(grace),
                   LAMEDUCK_STAGGER=str(stagger), LAMEDUCK_LOCK_TTL=str(lock_ttl))
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(_command(server), env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + 20
        # bound is not enough: hypercorn binds before it listens, so it must answer too
        try:
            while not self._listens() or not self._answers():
                if self.proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"{server} {name} did not start:\n{self.log()}")
                time.sleep(0.05)
        except BaseException:
            self.stop()  # never left running behind a failed start
            raise

    def _listens(self) -> bool:
        """Whether it (or its worker) listens yet; reads the port back on the first time."""
        if not self.port:
            ports = listening_ports(self.proc.pid)
            if len(ports) > 1:
                raise RuntimeError(f"{self.server} {self.name} listens on {ports}: which?")
            self.port = ports.pop() if ports else 0
        return bool(self.port)

    def _answers(self) -> bool:
        try:
            return httpx.get(self.url("/health"), timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/") -> str:
        return f"http://{self.addr}{path}"

    def ws_url(self, path: str = "/ws") -> str:
        return f"ws://{self.addr}{path}"

    def signal(self, sig: int = signal.SIGTERM) -> None:
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        # granian's workers are its children: the whole session goes, even after the main one
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        stop(self.proc)
