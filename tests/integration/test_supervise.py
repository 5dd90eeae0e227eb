"""`lameduck supervise`: the process a container or systemd starts. SIGHUP hot-restarts the
child with the config (checked first), SIGTERM drains and exits, a child that dies is started
again, and every child is reaped. Real processes; load from tests/loadgen.py."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.integration.test_hot_restart import Load, _config, _epoch
from tests.procs import Lameduck, children_of, wait_until


def _children(pid: int) -> list[int]:
    return children_of(pid)


def _supervised(origin_port: int, tmp_path: Path) -> tuple[Lameduck, dict[str, Any]]:
    cfg = _config(origin_port, tmp_path)
    sup = Lameduck(cfg, tmp_path).start(command="supervise")
    return sup, cfg


def test_sighup_hot_restarts_under_load_and_sigterm_drains(
        origin_port: int, tmp_path: Path) -> None:
    sup, _ = _supervised(origin_port, tmp_path)
    first = _children(sup.pid)
    assert len(first) == 1
    load = Load(sup.port)
    try:
        for epoch in (1, 2, 3):
            sup.signal(signal.SIGHUP)
            assert wait_until(lambda e=epoch: _epoch(sup) == e, 15), sup.log()
            # the old child drains and exits; the supervisor reaps it
            assert wait_until(lambda: len(_children(sup.pid)) == 1, 10), sup.log()
    finally:
        counts = load.finish()
    assert counts.failed == 0 and counts.ok > 0, load.report()
    assert _children(sup.pid) != first
    kids = _children(sup.pid)
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0
    assert "drain complete" in sup.log()
    assert not any(_alive(k) for k in kids)


def test_sighup_with_a_broken_config_changes_nothing(origin_port: int, tmp_path: Path) -> None:
    sup, cfg = _supervised(origin_port, tmp_path)
    child = _children(sup.pid)
    sup.path.write_text(yaml.safe_dump(dict(cfg, drain={"time": "banana"})))
    sup.signal(signal.SIGHUP)
    assert wait_until(lambda: "config not valid, nothing changed" in sup.log(), 5), sup.log()
    assert "drain.time" in sup.log()
    time.sleep(0.5)
    assert _children(sup.pid) == child
    assert httpx.get(sup.url("/"), timeout=5).status_code == 200
    assert _epoch(sup) == 0
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0


def test_a_child_killed_is_started_again(origin_port: int, tmp_path: Path) -> None:
    sup, _ = _supervised(origin_port, tmp_path)
    (child,) = _children(sup.pid)
    os.kill(child, signal.SIGKILL)
    assert wait_until(lambda: _children(sup.pid) not in ([], [child]), 10), sup.log()
    # Nobody hands it the sockets: it binds new ephemeral ports, and rewrites the admin
    # address file the supervisor passes on (--admin-address-path) once it serves.
    assert wait_until(lambda: sup.reread() and _ready(sup), 10), sup.log()
    assert httpx.get(sup.url("/"), timeout=5).status_code == 200
    kids = _children(sup.pid)
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0
    assert not any(_alive(k) for k in kids)  # forwarded, drained, reaped


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _ready(ld: Lameduck) -> bool:
    try:
        return ld.admin("GET", "/ready").status_code == 200
    except httpx.HTTPError:
        return False


def test_a_first_child_that_cannot_start_ends_the_supervisor(
        origin_port: int, tmp_path: Path) -> None:
    """No restart loop for a child that can never serve: its failure is the exit code."""
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    cfg = _config(origin_port, tmp_path)
    cfg["listeners"][0]["address"] = f"127.0.0.1:{busy.getsockname()[1]}"
    sup = Lameduck(cfg, tmp_path)
    try:
        with contextlib.suppress(RuntimeError):  # it exits: start may see that, or not
            sup.start(command="supervise", timeout=15)
        assert sup.wait(15) == 1
        assert "did not become ready" in sup.log()
    finally:
        busy.close()
        sup.kill()
