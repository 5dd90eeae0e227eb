"""The listening sockets `lameduck supervise` holds for its children, as gunicorn's master and
systemd's socket units do: a child that dies leaves the kernel's accept queue open, so new
connections wait there for the replacement instead of being refused.

The supervisor never accepts on them; each child gets them the way systemd passes sockets
(sd_listen_fds(3): fd 3 on, ``LISTEN_FDNAMES`` = the listener names), and `lameduck run`
takes them as it takes systemd's.

A re-read config (SIGHUP) is matched against what is held, listener by listener: the same name
and address keeps its socket (an ephemeral port stays the port it got); a socket systemd
passed stays with the listener named after it, wherever the config says it listens (as in
`lameduck run`); a new or moved listener is bound by the supervisor before the new child
starts (an address that cannot be bound fails the reload, nothing changes); sockets no
listener of the new config takes are closed once the new child serves (the old child, which
drains, has its own copies).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from lameduck.config import ListenerConfig

log = logging.getLogger("lameduck.supervise")

BACKLOG = 1024  # as `lameduck run` binds: the queue that carries a restart


@dataclass
class Held:
    address: str  # as configured ("127.0.0.1:0" included)
    sock: socket.socket
    from_systemd: bool = False

    def where(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind(lc: ListenerConfig) -> socket.socket:
    """A listening socket at the listener's address, as `lameduck run` would bind it."""
    addr = lc.address
    family = socket.AF_INET6 if ":" in addr.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr.host, addr.port))
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"listeners {lc.name}: cannot bind {addr}: {e.strerror}") from e
    return sock


class HeldSockets:
    """listener name → the socket held for it; ``plan``/``commit``/``abort`` for a reload."""

    def __init__(self) -> None:
        self.held: dict[str, Held] = {}

    def adopt(self, listeners: Iterable[ListenerConfig],
              passed: dict[str, socket.socket]) -> None:
        """The first config: systemd's sockets (``passed``, by listener name), the rest bound
        here. Raises OSError naming the listener whose address is taken."""
        fresh = {}
        try:
            for lc in listeners:
                sock = passed.pop(lc.name, None)
                if sock is not None:
                    sock.set_inheritable(False)
                    fresh[lc.name] = Held(str(lc.address), sock, from_systemd=True)
                    log.info("listener %s: holding the socket passed by systemd (%s)",
                             lc.name, fresh[lc.name].where())
                else:
                    fresh[lc.name] = Held(str(lc.address), bind(lc))
                    log.info("listener %s: holding %s", lc.name, fresh[lc.name].where())
        except OSError:
            for h in fresh.values():
                h.sock.close()
            raise
        self.held = fresh

    def plan(self, listeners: Iterable[ListenerConfig]) -> dict[str, Held]:
        """What the next child gets for a re-read config (see the module's rule); binds what is
        new. Nothing held changes until ``commit``. Raises OSError naming the listener."""
        left = dict(self.held)
        out: dict[str, Held] = {}
        todo = []
        for lc in listeners:
            h = left.get(lc.name)
            if h is not None and (h.from_systemd or h.address == str(lc.address)):
                out[lc.name] = left.pop(lc.name)
            else:
                todo.append(lc)
        bound: list[Held] = []
        try:
            for lc in todo:
                # a renamed listener at the same fixed address keeps its socket (binding it
                # again would fail: the held one listens there)
                same = next((n for n, h in left.items() if h.address == str(lc.address)
                             and lc.address.port != 0), None)
                if same is not None:
                    out[lc.name] = left.pop(same)
                    continue
                h = Held(str(lc.address), bind(lc))
                bound.append(h)
                out[lc.name] = h
                log.info("listener %s: holding %s (new)", lc.name, h.where())
        except OSError:
            for h in bound:
                h.sock.close()
            raise
        return out

    def commit(self, planned: dict[str, Held]) -> None:
        """The new child serves with ``planned``: what it did not take is no longer held."""
        kept = {id(h) for h in planned.values()}
        for name, h in self.held.items():
            if id(h) not in kept:
                log.info("listener %s: closing the socket held on %s (no longer configured; "
                         "the old child drains its own copy)", name, h.where())
                h.sock.close()
        self.held = planned

    def abort(self, planned: dict[str, Held]) -> None:
        """The reload failed: close what ``plan`` bound, keep what was held."""
        held = {id(h) for h in self.held.values()}
        for h in planned.values():
            if id(h) not in held:
                h.sock.close()

    def close(self) -> None:
        for h in self.held.values():
            h.sock.close()
        self.held = {}
