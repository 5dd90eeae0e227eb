"""An HTTP/3 listener's UDP sockets in a main process with workers: one per worker, all in
the port's SO_REUSEPORT group, steered by the connection id's worker byte
(``listeners.quic.steering_program``), and the forwarding sockets of hot restart.

The main process holds them, as it holds the TCP listening sockets: a worker that dies is
replaced by one that reads the same socket (the group's order, which the steering counts on,
never changes while the sockets live), and a successor is handed the whole group. Worker
``i`` reads ``udp[i]`` (and, in a group made for more workers than there are now, every
``udp[j]`` with ``j % workers == i``) and, once a successor reads the sockets, ``inboxes[i]``:
the successor's workers send it the packets of its connections over ``outlets[i]``.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from lameduck.listeners.base import ListenError
from lameduck.listeners.http import HttpListener


@dataclass
class QuicGroup:
    generation: int
    udp: list[socket.socket]  # in the group's order
    inboxes: list[socket.socket]  # one per worker
    outlets: list[socket.socket]  # their other ends, until a successor has them
    forward: dict[int, socket.socket] = field(default_factory=dict)  # older processes'

    def routes(self) -> dict[int, socket.socket]:
        """Where a successor forwards: each of our workers, and every older route whose
        process still lives."""
        from lameduck.listeners.quic import generation_mark, live_routes, route

        self.forward = live_routes(self.forward)
        mark = generation_mark(self.generation)
        return {**self.forward, **{route(mark, i): out for i, out in enumerate(self.outlets)}}

    def for_workers(self) -> dict[str, Any]:
        """The descriptors every worker is started with (it keeps its own: worker.serve)."""
        return {"generation": self.generation, "udp": [s.fileno() for s in self.udp],
                "inbox": [s.fileno() for s in self.inboxes],
                "forward": {str(r): s.fileno() for r, s in self.forward.items()}}

    def fds(self) -> list[int]:
        return [s.fileno() for s in (*self.udp, *self.inboxes, *self.forward.values())]

    def handed_over(self) -> None:
        """The successor has the sending ends to our workers: our copies go, so that each
        worker sees end of file once no newer process is left. Those to the older processes
        stay, as in each worker (listeners.quic.QuicEndpoint.handed_over)."""
        for s in self.outlets:
            s.close()
        self.outlets = []

    def close(self) -> None:
        for s in (*self.udp, *self.inboxes, *self.outlets, *self.forward.values()):
            s.close()
        self.udp, self.inboxes, self.outlets, self.forward = [], [], [], {}


def quic_group(listener: HttpListener, workers: int) -> QuicGroup:
    """The listener's group: the sockets the previous process handed over (every one of its
    group, in order), then as many more bound beside them as it takes to give each worker
    one; the steering program attached; a forwarding pair per worker. ListenError if the
    kernel will not steer (then a connection's packets would reach any worker)."""
    from lameduck.listeners.quic import (
        MAX_QUIC_WORKERS,
        bind_udp,
        forward_pair,
        steer_by_worker,
    )

    port = listener.sockname[1]
    udp: list[socket.socket] = []
    if listener.quic_socket is not None:
        udp = [listener.quic_socket, *listener.quic_extra]
    group = QuicGroup(listener.generation, udp, [], [], listener.quic_forward)
    listener.quic_socket, listener.quic_extra, listener.quic_forward = None, [], {}
    try:
        if workers > MAX_QUIC_WORKERS:
            raise ListenError(listener.name, f"{listener.cfg.address.host}:{port}/udp (http3)",
                              OSError(f"at most {MAX_QUIC_WORKERS} workers with http3"))
        while len(group.udp) < workers:
            group.udp.append(bind_udp(listener, port))
        try:
            steer_by_worker(group.udp[0])
        except OSError as e:
            raise ListenError(listener.name, f"{listener.cfg.address.host}:{port}/udp (http3)",
                              OSError(e.errno, f"cannot steer QUIC packets to their workers "
                                               f"(SO_ATTACH_REUSEPORT_CBPF: {e.strerror}); "
                                               f"run http3 with workers: 1")) from e
        for _ in range(workers):
            inbox, outlet = forward_pair()
            group.inboxes.append(inbox)
            group.outlets.append(outlet)
    except BaseException:
        group.close()
        raise
    return group
