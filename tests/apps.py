"""The demo resume app (lameduck/demo/resume_app.py) under a real ASGI server: uvicorn,
hypercorn or granian, as a child process on a free loopback port, stopped by pid."""

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
from tests.procs import _env, free_port, stop

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


def _command(server: str, port: int) -> list[str]:
    if server == "uvicorn":
        return [sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port",
                str(port), "--log-level", "warning", "--lifespan", "on"]
    if server == "hypercorn":
        return [sys.executable, "-m", "hypercorn", APP, "--bind", f"127.0.0.1:{port}",
                "--workers", "0", "--graceful-timeout", "10"]
    if server == "granian":
        return [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1",
                "--port", str(port), "--workers", "1", "--log-level", "warning", APP]
    raise ValueError(server)


class App:
    def __init__(self, server: str, name: str, store: str, workdir: Path, grace: float = 5.0,
                 stagger: float = 0.5, lock_ttl: float = 60.0) -> None:
        self.server = server
        self.name = name
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{name}.log"
        env = _env()
        env.update(LAMEDUCK_APP_NAME=name, LAMEDUCK_STORE=store, LAMEDUCK_GRACE=str(grace),
                   LAMEDUCK_STAGGER=str(stagger), LAMEDUCK_LOCK_TTL=str(lock_ttl))
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(_command(server, self.port), env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + 20
        while not self._answers():  # bound is not enough: hypercorn binds before it listens
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"{server} {name} did not start:\n{self.log()}")
            time.sleep(0.05)

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
