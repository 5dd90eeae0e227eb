"""The supervisor's rule for the sockets it holds across a reload (restart/held.py), on real
loopback sockets; and how it reads a child's signal handling and exit."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator

import pytest

from lameduck.config import ListenerConfig
from lameduck.restart.held import HeldSockets
from lameduck.restart.supervisor import describe_exit, handles


def _lc(name: str, address: str) -> ListenerConfig:
    return ListenerConfig(name=name, address=address,
                          routes=[{"prefix": "/", "cluster": "app"}])


def _open(sock: socket.socket) -> bool:
    return sock.fileno() >= 0


@pytest.fixture
def held() -> Iterator[HeldSockets]:
    h = HeldSockets()
    yield h
    h.close()


def test_kept_moved_added_and_removed(held: HeldSockets) -> None:
    held.adopt([_lc("keep", "127.0.0.1:0"), _lc("gone", "127.0.0.1:0"),
                _lc("moved", "127.0.0.1:0")], {})
    before = dict(held.held)
    planned = held.plan([_lc("keep", "127.0.0.1:0"), _lc("moved", "127.0.0.2:0"),
                         _lc("added", "127.0.0.1:0")])
    assert planned["keep"] is before["keep"]  # same name, same address: the same socket
    assert planned["moved"].sock.getsockname()[0] == "127.0.0.2"
    assert "added" in planned and "gone" not in planned
    assert all(_open(h.sock) for h in before.values())  # nothing closed before commit
    held.commit(planned)
    assert not _open(before["gone"].sock) and not _open(before["moved"].sock)
    assert _open(before["keep"].sock)
    assert set(held.held) == {"keep", "moved", "added"}


def test_abort_closes_only_what_plan_bound(held: HeldSockets) -> None:
    held.adopt([_lc("keep", "127.0.0.1:0")], {})
    keep = held.held["keep"]
    planned = held.plan([_lc("keep", "127.0.0.1:0"), _lc("added", "127.0.0.1:0")])
    held.abort(planned)
    assert not _open(planned["added"].sock)
    assert _open(keep.sock) and held.held == {"keep": keep}


def test_an_address_that_cannot_be_bound_names_the_listener(held: HeldSockets) -> None:
    held.adopt([_lc("keep", "127.0.0.1:0")], {})
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))  # bound without SO_REUSEADDR: a second bind fails
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"listeners extra: cannot bind 127.0.0.1:{port}"):
            held.plan([_lc("keep", "127.0.0.1:0"), _lc("fresh", "127.0.0.1:0"),
                       _lc("extra", f"127.0.0.1:{port}")])
    assert set(held.held) == {"keep"}


def test_a_renamed_listener_at_a_fixed_address_keeps_its_socket(held: HeldSockets) -> None:
    with socket.socket() as reserve:  # holds a port for the test, never listens
        reserve.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        reserve.bind(("127.0.0.1", 0))
        port = reserve.getsockname()[1]
        held.adopt([_lc("old", f"127.0.0.1:{port}")], {})
        sock = held.held["old"].sock
        planned = held.plan([_lc("new", f"127.0.0.1:{port}")])
        assert planned["new"].sock is sock


def test_a_socket_from_systemd_stays_with_its_listener(held: HeldSockets) -> None:
    passed = socket.socket()
    passed.bind(("127.0.0.1", 0))
    passed.listen(8)
    held.adopt([_lc("ingress", "127.0.0.1:1")], {"ingress": passed})
    assert held.held["ingress"].sock is passed and held.held["ingress"].from_systemd
    planned = held.plan([_lc("ingress", "127.0.0.1:2")])  # the config moved: systemd decides
    assert planned["ingress"].sock is passed


def test_handles_reads_the_caught_and_ignored_signals() -> None:
    old = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        assert not handles(os.getpid(), signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, lambda *_: None)
        assert handles(os.getpid(), signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        assert handles(os.getpid(), signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_describe_exit() -> None:
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "was killed by SIGKILL"
