"""`lameduck supervise` holds the listening sockets (as gunicorn's master and systemd's socket
units do) and passes them to each child the sd_listen_fds(3) way: a child that dies costs only
the requests it held, new connections wait in the kernel's accept queue for the replacement.
Real processes; load from tests/loadgen.py (keep-alive and new-connection clients)."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.test_hot_restart import Load, _config, _epoch
from tests.procs import SDACTIVATE, Lameduck, children_of, refusing_port, wait_until


def _child(sup: Lameduck) -> int:
    kids = children_of(sup.pid)
    assert len(kids) == 1, kids
    return kids[0]


def _established(pid: int, port: int) -> int:
    """Downstream connections ``pid`` holds on local ``port`` (ESTABLISHED, state 01, among its
    descriptors' socket inodes in /proc/PID/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    n = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port and int(f[9]) in inodes:
            n += 1
    return n


def _ready(sup: Lameduck) -> bool:
    try:
        return sup.reread() and sup.admin("GET", "/ready").status_code == 200
    except httpx.HTTPError:
        return False


def test_sigkill_of_the_child_under_load_refuses_no_connection(
        origin_port: int, tmp_path: Path) -> None:
    """The child is frozen (SIGSTOP), the connections it holds on the listener are counted —
    each carries at most one request in flight (HTTP/1.1, no pipelining) — then it is
    SIGKILLed. Refused: none. Failed: at most those connections' requests."""
    sup = Lameduck(_config(origin_port, tmp_path), tmp_path).start(command="supervise")
    port = sup.port
    child = _child(sup)
    load = Load(port, seconds=30)
    try:
        assert wait_until(lambda: sup.stat("http.ingress.downstream_rq_total") > 200, 10)
        os.kill(child, signal.SIGSTOP)
        held = _established(child, port)
        os.kill(child, signal.SIGKILL)
        assert wait_until(lambda: children_of(sup.pid) not in ([], [child]), 10), sup.log()
        assert wait_until(lambda: _ready(sup), 15), sup.log()
        # the replacement serves the same port, and the load goes on through it
        assert sup.port == port
        assert wait_until(lambda: sup.stat("http.ingress.downstream_rq_total") > 200, 10)
    finally:
        counts = load.finish()
    report = f"{load.report()} held at kill={held}"
    print(report)
    assert held > 0, report  # the kill did hit connections
    assert counts.refused == 0, report
    assert counts.failed <= held, report
    log = sup.log()
    assert f"child {child} was killed by SIGKILL" in log
    assert f"child {child} died; restarting in 0.2s" in log
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0, sup.log()


def test_sighup_with_moved_added_and_removed_listeners(origin_port: int,
                                                       tmp_path: Path) -> None:
    """The supervisor binds what the new config adds or moves before the new child starts, and
    closes what it no longer configures once the new child serves: the old child drains its own
    copy, then the port refuses."""
    cfg = _config(origin_port, tmp_path)
    keep = cfg["listeners"][0]
    gone = dict(keep, name="gone")
    moved = dict(keep, name="moved")
    cfg["listeners"] = [keep, gone, moved]
    sup = Lameduck(cfg, tmp_path).start(command="supervise")
    old_child = _child(sup)
    before = dict(sup.addrs)
    new_cfg = dict(cfg, listeners=[keep, dict(moved, address="127.0.0.2:0"),
                                   dict(keep, name="added")])
    sup.path.write_text(yaml.safe_dump(new_cfg))
    load = Load(sup.port, seconds=30)
    try:
        sup.signal(signal.SIGHUP)
        assert wait_until(lambda: _epoch(sup) == 1 and sup.reread(), 15), sup.log()
        assert wait_until(lambda: old_child not in children_of(sup.pid), 10), sup.log()
    finally:
        counts = load.finish()
    assert counts.failed == 0 and counts.ok > 0, load.report()
    assert sup.addr_of("ingress") == before["ingress"]  # kept: the same socket
    assert sup.addr_of("moved").startswith("127.0.0.2:")
    for name in ("ingress", "moved", "added"):
        assert httpx.get(f"http://{sup.addr_of(name)}/", timeout=5).status_code == 200
    for name in ("gone", "moved"):
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{before[name]}/", timeout=5)
    assert "listener gone: closing the socket held on" in sup.log()
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0, sup.log()


def test_sighup_with_an_address_that_cannot_be_bound_changes_nothing(
        origin_port: int, tmp_path: Path) -> None:
    cfg = _config(origin_port, tmp_path)
    sup = Lameduck(cfg, tmp_path).start(command="supervise")
    child = _child(sup)
    busy = refusing_port()  # bound, never listening: a bind there fails
    extra = dict(cfg["listeners"][0], name="extra", address=f"127.0.0.1:{busy}")
    sup.path.write_text(yaml.safe_dump(
        dict(cfg, listeners=[cfg["listeners"][0], extra])))
    sup.signal(signal.SIGHUP)
    want = f"SIGHUP: listeners extra: cannot bind 127.0.0.1:{busy}"
    assert wait_until(lambda: want in sup.log(), 5), sup.log()
    assert "nothing changed" in sup.log()
    assert children_of(sup.pid) == [child]
    assert httpx.get(sup.url("/"), timeout=5).status_code == 200
    assert _epoch(sup) == 0
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0, sup.log()


def test_sockets_from_systemd_are_held_across_a_child_crash(
        origin_port: int, tmp_path: Path) -> None:
    """Socket activation into supervise: the socket named after the listener is held by the
    supervisor (the configured address is one this test keeps bound, so a bind would fail), and
    a connection made while no child runs is answered by the replacement."""
    passed = socket.socket()
    passed.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    passed.bind(("127.0.0.1", 0))
    passed.listen(128)
    port = passed.getsockname()[1]
    cfg = _config(origin_port, tmp_path)
    cfg["listeners"][0]["address"] = f"127.0.0.1:{refusing_port()}"
    sup = Lameduck(cfg, tmp_path)
    fd = passed.fileno()
    sup.start(command="supervise", wrapper=[*SDACTIVATE, f"{fd}=ingress", "--"],
              pass_fds=(fd,))
    passed.close()
    assert sup.port == port
    assert "listener ingress: holding the socket passed by systemd" in sup.log()
    child = _child(sup)
    os.kill(child, signal.SIGSTOP)  # no child accepts from here until the replacement
    os.kill(child, signal.SIGKILL)
    early = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        early.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        t0 = time.monotonic()
        while chunk := early.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
        assert time.monotonic() - t0 < 10
    finally:
        early.close()
    assert f"child {child} was killed by SIGKILL" in sup.log()
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0, sup.log()
