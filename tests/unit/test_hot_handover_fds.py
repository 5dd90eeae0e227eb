"""A hot restart hands every socket over in one message, its descriptors passed with
SCM_RIGHTS: a listener per worker in an SO_REUSEPORT group, and for HTTP/3 a UDP socket and
forwarding sockets per worker, pass the kernel's SCM_MAX_FD (253) in one sendmsg (unix(7)),
which fails the whole handover with EINVAL. Real sockets over a real Unix socket: the
running side (``Rendezvous``) and the new one (``connect_parent``)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

from lameduck.restart.hot import Rendezvous, connect_parent

N = 300  # more than SCM_MAX_FD


class _Source:
    """A running process with ``N`` listening sockets, nothing else."""

    epoch = 3
    started_all = 0.0
    config_path = "/etc/lameduck.yaml"

    def __init__(self, socks: list[socket.socket]) -> None:
        self.socks = socks

    def handover_sockets(self) -> tuple[list[tuple[str, str, Any]], None]:
        return [(f"l{i}", f"127.0.0.1:{i}", s) for i, s in enumerate(self.socks)], None

    def listener_definitions(self) -> dict[str, Any]:
        return {}

    def handover_quic(self) -> list[Any]:
        return []

    def quic_handed_over(self, names: list[str]) -> None:
        pass

    def counters(self) -> dict[str, int]:
        return {}

    def connections(self) -> int:
        return 0

    def draining_listeners(self) -> int:
        return 0

    def hand_over(self) -> None:
        pass


def test_more_sockets_than_one_sendmsg_carries_are_all_handed_over(tmp_path: Path) -> None:
    socks = []
    for _ in range(N):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    loop = asyncio.new_event_loop()
    rv = Rendezvous(str(tmp_path / "restart.sock"), loop, _Source(socks))  # type: ignore[arg-type]
    try:
        rv.start()
        inh = loop.run_until_complete(asyncio.wait_for(loop.run_in_executor(
            None, connect_parent, rv.path, "/etc/lameduck.yaml", 30.0), 60))
        assert inh is not None and inh.epoch == 4
        got = inh.listeners
        assert len(got) == N
        for i, s in enumerate(socks):  # each one the same socket, in its place
            addr, mine = got[f"l{i}"]
            assert addr == f"127.0.0.1:{i}"
            assert mine.getsockname() == s.getsockname()
            mine.close()
        inh.link.close()
    finally:
        rv._stop_listening(unlink=True)
        for c, _ in list(rv.children.values()):
            c.close()
        loop.close()
        for s in socks:
            s.close()
