"""Connections waiting in the kernel's accept queue when a listener closes are reset: each is
a client that connected in time and was refused. The drain report and
``server.drain.cx_reset_listener_close`` count them, so a drain cannot read "nothing lost"
while clients were refused.

The lameduck server runs in this process on a real socket, with its event loop stopped while
clients connect: the kernel completes their handshakes and queues them, and nothing accepts
them before the listener closes. That makes the queue exact, not a race.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from lameduck.config import load_config_text
from lameduck.server import Server

CONFIG = """
admin: {address: "127.0.0.1:0"}
drain: {time: 1s, connection_grace: 100ms}
shutdown: {deadline: 2s, stop_accepting: immediately}
listeners:
  - {name: ingress, address: "127.0.0.1:0", routes: [{cluster: app}]}
clusters: [{name: app, endpoints: ["127.0.0.1:9"]}]
"""


def _queue(port: int, n: int) -> list[socket.socket]:
    """``n`` clients whose handshakes the kernel completes without the server accepting."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        socks.append(s)
    return socks


def _was_reset(s: socket.socket) -> bool:
    try:
        s.recv(1)
    except ConnectionResetError:
        return True
    return False


def test_listener_close_counts_the_accept_queue(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.new_event_loop()
    try:
        server = Server(load_config_text(CONFIG), loop)
        loop.run_until_complete(server.start())
        [listener] = server.listeners
        clients = _queue(listener.port, 3)
        caplog.set_level(logging.INFO, "lameduck")
        server.begin_shutdown()  # stop_accepting: immediately closes the listener now
        assert not listener.accepting
        code = loop.run_until_complete(asyncio.wait_for(server.done, 5))
        assert code == 0  # no request was cut: the refusals are counted, not hidden
        assert server.drain_stats.cx_reset_listener_close == 3
        assert all(_was_reset(c) for c in clients)
        for c in clients:
            c.close()
        assert "reset in the accept queue at listener close=3" in caplog.text
        assert server.counters()["server.drain.cx_reset_listener_close"] == 3
    finally:
        loop.close()


def test_a_client_in_the_accept_queue_keeps_an_idle_process_serving() -> None:
    """With ``min_drain: 0s`` a process with no connection may exit before T, but not while
    clients wait in the accept queue of a listener still accepting: they are accepted and
    drained, not reset."""
    loop = asyncio.new_event_loop()
    try:
        server = Server(load_config_text(CONFIG.replace(
            "stop_accepting: immediately", "stop_accepting: at_drain_end, min_drain: 0s")), loop)
        loop.run_until_complete(server.start())
        [listener] = server.listeners
        clients = _queue(listener.port, 3)
        server.begin_shutdown()
        assert listener.accepting and server.connections() == 0 and listener.queued() == 3
        code = loop.run_until_complete(asyncio.wait_for(server.done, 5))
        assert code == 0
        assert server.drain_stats.cx_reset_listener_close == 0
        assert not any(_was_reset(c) for c in clients)
        for c in clients:
            c.close()
    finally:
        loop.close()


def test_hot_restart_hand_over_resets_nothing() -> None:
    """Handed to a successor, the socket stays open there: its queue is the successor's to
    accept, not a reset."""
    loop = asyncio.new_event_loop()
    try:
        server = Server(load_config_text(CONFIG), loop)
        loop.run_until_complete(server.start())
        [listener] = server.listeners
        keep = socket.fromfd(listener.server.sockets[0].fileno(), socket.AF_INET,  # type: ignore[union-attr]
                             socket.SOCK_STREAM)  # the successor's copy
        clients = _queue(listener.port, 2)
        server.hand_over()
        assert server.drain_stats.cx_reset_listener_close == 0
        conn, _ = keep.accept()  # still queued, now for the successor
        conn.close()
        keep.close()
        for c in clients:
            c.close()
        loop.run_until_complete(asyncio.wait_for(server.done, 5))
    finally:
        loop.close()
