"""`lameduck supervise`: the process a container or systemd starts. SIGHUP hot-restarts the
child with the config (checked first), SIGTERM drains and exits, a child that dies is started
again, and every child is reaped. Real processes; load from tests/loadgen.py."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from lameduck.restart.supervisor import handles
from tests.integration.test_hot_restart import Load, _config, _epoch
from tests.procs import Lameduck, children_of, refusing_port, wait_until


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


def test_the_start_up_text_says_to_signal_the_supervisor(
        origin_port: int, tmp_path: Path) -> None:
    """A child sent SIGTERM alone is restarted: the banner's stop advice names the supervisor
    (Docker's ENTRYPOINT, pid 1 in a container), never the child."""
    sup, _ = _supervised(origin_port, tmp_path)
    (child,) = _children(sup.pid)
    assert wait_until(lambda: f"kill -TERM {sup.pid}" in sup.log(), 10), sup.log()
    text = sup.log()
    assert f"kill -HUP {sup.pid}" in text and "docker stop" in text
    assert f"kill -TERM {child}" not in text and f"kill -HUP {child}" not in text
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0


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
    port = sup.port
    os.kill(child, signal.SIGKILL)
    assert wait_until(lambda: _children(sup.pid) not in ([], [child]), 10), sup.log()
    # The supervisor holds the listening sockets: the replacement serves the same port. Its
    # admin binds anew (an ephemeral admin port changes) and it rewrites the admin address
    # file the supervisor passes on (--admin-address-path) once it serves.
    assert wait_until(lambda: sup.reread() and _ready(sup), 10), sup.log()
    assert sup.port == port
    assert httpx.get(sup.url("/"), timeout=5).status_code == 200
    log = sup.log()
    assert f"child {child} was killed by SIGKILL" in log
    assert f"child {child} died; restarting in 0.2s" in log
    kids = _children(sup.pid)
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0
    assert f"SIGTERM sent to child {kids[0]} (drain and exit)" in sup.log()
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


def test_a_listener_address_in_use_ends_the_supervisor(
        origin_port: int, tmp_path: Path) -> None:
    """The supervisor binds the listeners itself: a taken address is its own failure, named,
    before any child starts."""
    busy = refusing_port()
    cfg = _config(origin_port, tmp_path)
    cfg["listeners"][0]["address"] = f"127.0.0.1:{busy}"
    sup = Lameduck(cfg, tmp_path)
    with contextlib.suppress(RuntimeError):  # it exits: start may see that, or not
        sup.start(command="supervise", timeout=15)
    assert sup.wait(15) == 1
    assert f"listeners ingress: cannot bind 127.0.0.1:{busy}" in sup.log()
    assert "child" not in sup.log()


def test_a_first_child_that_cannot_start_ends_the_supervisor(
        origin_port: int, tmp_path: Path) -> None:
    """No restart loop for a child that can never serve (here its admin address is taken):
    its failure is the exit code, and the log does not promise a restart."""
    busy = refusing_port()
    cfg = _config(origin_port, tmp_path)
    cfg["admin"]["address"] = f"127.0.0.1:{busy}"
    sup = Lameduck(cfg, tmp_path)
    with contextlib.suppress(RuntimeError):
        sup.start(command="supervise", timeout=15)
    assert sup.wait(15) == 1
    log = sup.log()
    assert "did not become ready" in log
    assert "before it was ever ready: not restarting it" in log
    assert "restarting in" not in log and "forwarding" not in log


def _slow_request(sup: Lameduck, ms: int) -> tuple[threading.Thread, list[Any]]:
    """A request the origin answers after ``ms``, in a thread; its outcome lands in the list
    (a status or an exception). Returns once the child counts it in flight."""
    out: list[Any] = []

    def go() -> None:
        try:
            out.append(httpx.get(sup.url(f"/sleep?ms={ms}"), timeout=10).status_code)
        except httpx.HTTPError as e:
            out.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    assert wait_until(lambda: _active(sup) == 1, 5), sup.log()
    return t, out


def _active(sup: Lameduck) -> int:
    try:
        return sup.stat("http.ingress.downstream_rq_active")
    except (httpx.HTTPError, KeyError):
        return -1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT, signal.SIGINT],
                         ids=lambda s: s.name)
def test_a_stop_signal_is_forwarded_and_the_request_in_flight_completes(
        origin_port: int, tmp_path: Path, sig: signal.Signals) -> None:
    sup, _ = _supervised(origin_port, tmp_path)
    (child,) = _children(sup.pid)
    assert handles(child, signal.SIGQUIT)  # `lameduck run` drains on SIGQUIT itself
    t, out = _slow_request(sup, 800)
    sup.signal(sig)
    t.join(10)
    assert out == [200], (out, sup.log())
    assert sup.wait(10) == 0, sup.log()
    log = sup.log()
    assert f"{sig.name} sent to child {child} (drain and exit" in log, log
    assert f"child {child} exited with code 0" in log
    assert not _alive(child)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2], ids=lambda s: s.name)
def test_sigusr_is_forwarded_to_the_child_which_serves_on(
        origin_port: int, tmp_path: Path, sig: signal.Signals) -> None:
    """SIGUSR1 (reopen log files) and SIGUSR2 (logged, ignored) would end a process that does
    not handle them (signal(7)); the supervisor forwards them only where they are handled (see
    test_supervise_held.py), and `lameduck run` handles both: the child serves on and the
    request in flight completes."""
    sup, _ = _supervised(origin_port, tmp_path)
    (child,) = _children(sup.pid)
    assert handles(child, sig)
    t, out = _slow_request(sup, 500)
    sup.signal(sig)
    t.join(10)
    assert out == [200], (out, sup.log())
    want = f"{sig.name} sent to child {child}"
    assert wait_until(lambda: want in sup.log(), 5), sup.log()
    assert _children(sup.pid) == [child]
    assert httpx.get(sup.url("/"), timeout=5).status_code == 200
    sup.signal(signal.SIGTERM)
    assert sup.wait(10) == 0, sup.log()


def test_a_second_sigint_kills_the_child_and_exits_at_once(
        origin_port: int, tmp_path: Path) -> None:
    """The first SIGINT drains; the second is the operator wanting out now: the child is
    SIGKILLed (its request in flight is cut) and the supervisor exits 130 without waiting for
    the drain."""
    sup, _ = _supervised(origin_port, tmp_path)
    (child,) = _children(sup.pid)
    t, out = _slow_request(sup, 5000)
    sup.signal(signal.SIGINT)
    assert wait_until(lambda: f"SIGINT sent to child {child}" in sup.log(), 5), sup.log()
    t0 = time.monotonic()
    sup.signal(signal.SIGINT)
    assert sup.wait(5) == 130, sup.log()
    assert time.monotonic() - t0 < 4  # not the 5 s request, not the drain
    t.join(10)
    assert len(out) == 1 and isinstance(out[0], httpx.HTTPError), out
    log = sup.log()
    assert f"second SIGINT: killing child {child} and exiting" in log
    assert f"child {child} was killed by SIGKILL" in log
    assert not _alive(child)
