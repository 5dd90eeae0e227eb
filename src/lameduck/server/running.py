"""Who already serves here: a plain `lameduck run` refuses to start where another lameduck
runs (its hot-restart socket, or its admin address) instead of taking it over, and names it.

Two unrelated instances share a host easily: every config defaults to the admin address
127.0.0.1:9901, from which the hot-restart socket is derived. Taking over is what
``--hot-restart``, SIGHUP and ``lameduck supervise`` are for.
"""

from __future__ import annotations

import json
import socket

from lameduck.config import Config, HostPort
from lameduck.restart.hot import Running, who_runs

PROBE_TIMEOUT = 2.0


def admin_owner(address: HostPort, timeout: float = PROBE_TIMEOUT) -> Running | None:
    """The lameduck whose admin API answers at ``address`` (its ``/server_info`` names its pid
    and config path); None if nothing listens there, or what listens is not lameduck."""
    if address.port == 0:
        return None
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout) as s:
            s.sendall(f"GET /server_info HTTP/1.1\r\nHost: {address}\r\n"
                      "Connection: close\r\n\r\n".encode())
            data = b""
            while len(data) < 1 << 20 and (chunk := s.recv(65536)):
                data += chunk
    except OSError:
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return None
    try:
        info = json.loads(body)
        if not str(info["version"]).startswith("lameduck/"):
            return None
        config = info.get("command_line_options", {}).get("config_path")
        return Running(int(info["pid"]), config if isinstance(config, str) else None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def refusal(cfg: Config, restart_path: str | None) -> str | None:
    """Why this process must not start (another lameduck serves its hot-restart socket or its
    admin address), or None. OSError: the rendezvous directory is not ours to use."""
    hint = ("to replace it, send it SIGHUP (it re-reads its config) or start this one with "
            "`lameduck run --hot-restart` (same config path); to run beside it, give this "
            "config another admin.address (and hot_restart.socket)")
    if restart_path is not None:
        r = who_runs(restart_path)
        if r is not None:
            return f"{_named(r)} already serves the hot-restart socket {restart_path}; {hint}"
    a = cfg.admin.address
    r = admin_owner(a)
    if r is not None:
        return f"{_named(r)} already serves the admin address {a}; {hint}"
    return None


def _named(r: Running) -> str:
    if r.config is None:
        return f"lameduck pid {r.pid} (config unknown)"
    return f"lameduck pid {r.pid} (config {r.config or 'none: the embedded default'})"
