"""Real processes for the tests: the demo origin and lameduck itself, on free loopback ports,
started and stopped by pid. No mocks: the tests talk to these over real sockets."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

SRC = Path(__file__).resolve().parents[1] / "src"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env.pop("NOTIFY_SOCKET", None)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_origin(stderr: IO[bytes] | int = subprocess.DEVNULL) -> tuple[subprocess.Popen, int]:
    """Start ``python -m lameduck.demo --port 0`` and read the bound port from its stdout."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lameduck.demo", "--port", "0"],
        stdout=subprocess.PIPE, stderr=stderr, env=_env(),
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    if not ready:
        stop(proc)
        raise RuntimeError("demo origin did not report its port within 10 s")
    line = proc.stdout.readline().decode()
    if not line.startswith("listening on 127.0.0.1:"):
        stop(proc)
        raise RuntimeError(f"unexpected startup line: {line!r}")
    return proc, int(line.rsplit(":", 1)[1])


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)


def base_config(origin_port: int, **over: Any) -> dict[str, Any]:
    """A config for one listener in front of the origin; ``over`` replaces top-level keys and
    ``listener`` / ``cluster`` / ``route`` merge into the first of each."""
    cfg: dict[str, Any] = {
        "admin": {"address": f"127.0.0.1:{free_port()}"},
        "drain": {"time": "2s", "strategy": "gradual", "connection_grace": "200ms"},
        "shutdown": {"deadline": "4s", "min_drain": "0s", "stop_accepting": "at_drain_end"},
        "listeners": [{
            "name": "ingress",
            "address": f"127.0.0.1:{free_port()}",
            "health_check_path": "/health_check.html",
            "routes": [{"prefix": "/", "cluster": "app", "timeout": "30s"}],
        }],
        "clusters": [{"name": "app", "endpoints": [f"127.0.0.1:{origin_port}"]}],
    }
    for key in ("listener", "cluster", "route"):
        extra = over.pop(key, None)
        if extra:
            target = {"listener": cfg["listeners"][0], "cluster": cfg["clusters"][0],
                      "route": cfg["listeners"][0]["routes"][0]}[key]
            target.update(extra)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return cfg


class Lameduck:
    """A lameduck process started with a config, stopped by pid."""

    def __init__(self, cfg: dict[str, Any], workdir: Path) -> None:
        self.cfg = cfg
        self.path = workdir / f"lameduck-{free_port()}.yaml"
        self.path.write_text(yaml.safe_dump(cfg))
        self.log_path = self.path.with_suffix(".log")
        self.admin_addr = cfg["admin"]["address"]
        self.addr = cfg["listeners"][0]["address"]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> Lameduck:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lameduck", "run", "-c", str(self.path)],
                stdout=log, stderr=subprocess.STDOUT, env=_env(),
            )
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lameduck exited early:\n{self.log()}")
            try:
                if httpx.get(self.admin_url("/ready"), timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"lameduck not ready within {timeout}s:\n{self.log()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    def url(self, path: str = "/") -> str:
        return f"http://{self.addr}{path}"

    def admin_url(self, path: str) -> str:
        return f"http://{self.admin_addr}{path}"

    def admin(self, method: str, path: str) -> httpx.Response:
        return httpx.request(method, self.admin_url(path), timeout=5)

    def stats(self) -> dict[str, int]:
        body = self.admin("GET", "/stats?format=json").json()
        return {s["name"]: s["value"] for s in body["stats"]}

    def stat(self, name: str) -> int:
        return self.stats()[name]

    def server_info(self) -> dict[str, Any]:
        return json.loads(self.admin("GET", "/server_info").text)

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        if self.proc is not None:
            stop(self.proc)
