"""Hot restart (Envoy's hot restart): a new process takes the running one's
listening sockets over a Unix socket (SCM_RIGHTS), becomes ready, and only then tells it to
stop accepting and drain. No connection is refused: both processes hold the same listening
sockets, so the kernel's accept queue is never closed, and the old one stops accepting only
once the new one accepts.

The rendezvous socket (owner-only) speaks length-prefixed JSON messages (4-byte big-endian
length); the one that carries descriptors sends them with its first byte.

    new → old   {"op": "hello", "pid": P, "config": path}
    old → new   {"op": "sockets", "epoch": E, "pid": P, "listeners": [[name, address], ...],
                 "admin": address or null, "counters": {...}, "started": wall,
                 "definitions": {name: listener config},
                 "quic": [[name, address, [route, ...]], ...]}
                + fds: the listeners', then the admin's, then for each "quic" entry its UDP
                  socket and one Unix seqpacket socket per route (generation mark and worker:
                  where that process's, or that worker's, QUIC packets are forwarded:
                  listeners.quic); a port's SO_REUSEPORT group of UDP sockets (one per
                  worker) is the entries "name", "name@1", "name@2", ...
    new → old   {"op": "drain", "quic": [name, ...]}   once the new process is ready; the
                                       listeners whose UDP socket it reads from now on
    old → new   {"op": "released"}     the old one stopped accepting and left the rendezvous
    old → new   {"op": "status", "connections": N, "draining": L, "counters": {...}}
                every STATUS_EVERY s (L: its listeners with connections left)

A new process that goes away before "drain" (a bad config caught late, a crash, a kill)
changes nothing in the old one: it keeps serving, untouched. A hello whose config path is not
the running one's is refused ({"op": "refused", "why": ...}): a hot restart replaces the same
service, not whatever else happens to share the admin port.

A plain `lameduck run` (no --hot-restart) only asks who runs there, and refuses to start:

    new → old   {"op": "who"}
    old → new   {"op": "whoami", "pid": P, "config": path}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import stat
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

log = logging.getLogger("lameduck.restart")

STATUS_EVERY: Final = 0.5
MAX_MESSAGE: Final = 16 << 20
MAX_FDS: Final = 512
FDS_PER_SEND: Final = 250  # below SCM_MAX_FD (253), the most one sendmsg may carry
_LEN: Final = struct.Struct(">I")


def default_path(admin_host: str, admin_port: int) -> str | None:
    """$TMPDIR/lameduck-<uid>/restart-<admin host>-<port>.sock: one per instance on a host
    (its admin address is unique). None for an ephemeral admin port: two unrelated instances
    would find each other, so hot restart needs ``hot_restart.socket`` there."""
    if admin_port == 0:
        return None
    host = admin_host.replace(":", "_").replace("/", "_")
    return os.path.join(tempfile.gettempdir(), f"lameduck-{os.getuid()}",
                        f"restart-{host}-{admin_port}.sock")


def _check_dir(d: str) -> None:
    """The rendezvous directory must be ours and closed to others: whoever can replace the
    socket in it could hand us sockets, or take ours."""
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(f"{d}: not a directory of uid {os.getuid()} closed to others "
                              f"(mode {st.st_mode & 0o777:o}, uid {st.st_uid})")


def _peer_is_us(sock: socket.socket) -> bool:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.getuid()


def _frame(msg: dict[str, Any]) -> bytes:
    data = json.dumps(msg, separators=(",", ":")).encode()
    return _LEN.pack(len(data)) + data


class _Reader:
    """Reassembles messages from a stream socket's reads (and the fds that came with them)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.fds: list[int] = []

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self.buf += data
        out = []
        while len(self.buf) >= 4:
            (n,) = _LEN.unpack_from(self.buf)
            if n > MAX_MESSAGE:
                raise ValueError(f"hot restart message of {n} bytes")
            if len(self.buf) < 4 + n:
                break
            msg = json.loads(bytes(self.buf[4:4 + n]))
            del self.buf[:4 + n]
            if not isinstance(msg, dict) or "op" not in msg:
                raise ValueError("hot restart message without an op")
            out.append(msg)
        return out


class HasFileno(Protocol):
    def fileno(self) -> int: ...


# -- the new process's side (blocking: it runs before the new process serves) ----------------


@dataclass
class Inherited:
    """What the running process handed over."""

    epoch: int  # this process's epoch (the parent's + 1)
    parent_pid: int
    listeners: dict[str, tuple[str, socket.socket]]  # name → (address as configured, socket)
    admin: tuple[str, socket.socket] | None  # (address as configured, socket)
    counters: dict[str, int]
    started: float  # wall time the first epoch started
    definitions: dict[str, Any]  # the old process's listener configs, by name
    link: socket.socket
    reader: _Reader = field(default_factory=_Reader)
    # name → (address as configured, UDP socket, {route: forwarding socket})
    quic: dict[str, tuple[str, socket.socket, dict[int, socket.socket]]] = field(
        default_factory=dict)
    quic_taken: list[str] = field(default_factory=list)  # the UDP sockets read here now

    def take_quic(self, name: str, address: str,
                  ) -> tuple[socket.socket, dict[int, socket.socket]] | None:
        """The listener's UDP socket and forwarding sockets, if its address is the same
        (else they are closed: the old process goes on reading its own)."""
        entry = self.quic.pop(name, None)
        if entry is None:
            return None
        addr, sock, forward = entry
        if addr != address:
            for s in (sock, *forward.values()):
                s.close()
            return None
        self.quic_taken.append(name)
        return sock, forward

    def renamed_quic(self, address: str, names: set[str],
                     ) -> tuple[str, tuple[socket.socket, dict[int, socket.socket]]] | None:
        """The UDP socket (and forwarding sockets) of an old listener at ``address`` whose
        name is none of ``names`` (the new config's listeners): a listener renamed over the
        restart. Taken, not bound anew beside it: a second group of sockets on the port
        would share the kernel's SO_REUSEPORT group with the old one, and the steering by
        connection id (listeners.quic) would send this process's packets to the old one's."""
        for name, (addr, _, _) in list(self.quic.items()):
            if addr == address and "@" not in name and name not in names:
                taken = self.take_quic(name, address)
                if taken is not None:
                    return name, taken
        return None

    def close_unused(self) -> None:
        for _, sock in self.listeners.values():
            sock.close()
        self.listeners.clear()
        for _, sock, forward in self.quic.values():
            for s in (sock, *forward.values()):
                s.close()
        self.quic.clear()
        if self.admin is not None:
            self.admin[1].close()
            self.admin = None


def _recv_message(sock: socket.socket, reader: _Reader) -> dict[str, Any]:
    while True:
        data, fds, _, _ = socket.recv_fds(sock, 65536, MAX_FDS)
        reader.fds.extend(fds)
        if not data:
            raise ConnectionError("the running lameduck closed the hot-restart socket")
        msgs = reader.feed(data)
        if msgs:
            if len(msgs) > 1:
                raise ValueError("unexpected hot restart messages")
            return msgs[0]


def _connect(path: str, timeout: float) -> socket.socket | None:
    """A connection to the rendezvous at ``path``; None if no process listens there (no file,
    or a stale one a killed process left)."""
    d = os.path.dirname(path)
    if d and os.path.exists(d):
        _check_dir(d)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        s.close()
        return None
    if not _peer_is_us(s):
        s.close()
        raise PermissionError(f"{path} is served by another user")
    return s


@dataclass(frozen=True)
class Running:
    """The lameduck serving a rendezvous: what a refusal names."""

    pid: int
    config: str | None  # its config path, absolute as given (None: unknown)


def who_runs(path: str, timeout: float = 2.0) -> Running | None:
    """The lameduck that listens at ``path``, without touching it; None if none does.
    Raises OSError when the path is not ours to use."""
    s = _connect(path, timeout)
    if s is None:
        return None
    with s:
        creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid = struct.unpack("3i", creds)[0]
        try:
            s.sendall(_frame({"op": "who"}))
            msg = _recv_message(s, _Reader())
        except (OSError, ValueError):
            return Running(pid, None)  # a lameduck that does not answer "who": still there
        config = msg.get("config") if msg.get("op") == "whoami" else None
        return Running(int(msg.get("pid", pid)), config if isinstance(config, str) else None)


def connect_parent(path: str, config: str | None, timeout: float = 10.0) -> Inherited | None:
    """Find the running lameduck at ``path`` and take its sockets; None if none runs there.
    ``config``: this process's config path; the running one refuses another service's.
    Raises OSError/ValueError when one answers but the handover fails (nothing changed in it)."""
    s = _connect(path, timeout)
    if s is None:
        return None
    try:
        s.sendall(_frame({"op": "hello", "pid": os.getpid(), "config": config}))
        reader = _Reader()
        msg = _recv_message(s, reader)
        if msg.get("op") == "refused":
            raise ConnectionRefusedError(f"the running lameduck refused: {msg.get('why')}")
        if msg.get("op") != "sockets":
            raise ValueError(f"unexpected hot restart reply {msg.get('op')!r}")
        names = msg["listeners"]
        quic = msg.get("quic", [])
        fds = reader.fds
        n_tcp = len(names) + (1 if msg["admin"] else 0)
        want = n_tcp + sum(1 + len(marks) for _, _, marks in quic)
        if len(fds) != want:
            raise ValueError(f"hot restart: {len(fds)} descriptors for {want} sockets")
        socks = [socket.socket(fileno=fd) for fd in fds]
        for sock in socks:
            sock.set_inheritable(False)
        reader.fds = []
        tcp, rest = socks[:n_tcp], iter(socks[n_tcp:])
        inherited_quic = {}
        for name, addr, marks in quic:
            udp = next(rest)
            inherited_quic[str(name)] = (str(addr), udp,
                                         {int(mark): next(rest) for mark in marks})
        return Inherited(
            epoch=int(msg["epoch"]) + 1, parent_pid=int(msg["pid"]),
            listeners={name: (addr, sock) for (name, addr), sock in zip(names, tcp,
                                                                         strict=False)},
            admin=(str(msg["admin"]), tcp[-1]) if msg["admin"] else None,
            counters={str(k): int(v) for k, v in msg["counters"].items()},
            started=float(msg["started"]), definitions=dict(msg.get("definitions", {})),
            link=s, reader=reader, quic=inherited_quic)
    except BaseException:
        s.close()
        raise


async def take_over(inh: Inherited, loop: asyncio.AbstractEventLoop, timeout: float = 10.0,
                    ) -> None:
    """Ready: tell the old process to drain, and wait until it stopped accepting."""
    link = inh.link
    link.setblocking(False)
    await asyncio.wait_for(loop.sock_sendall(link, _frame({"op": "drain",
                                                          "quic": inh.quic_taken})), timeout)
    end = loop.time() + timeout
    while True:
        data = await asyncio.wait_for(loop.sock_recv(link, 65536), max(end - loop.time(), 0))
        if not data:
            raise ConnectionError("the old lameduck went away before releasing its sockets")
        for msg in inh.reader.feed(data):
            if msg["op"] == "released":
                return


def follow_parent(inh: Inherited, loop: asyncio.AbstractEventLoop,
                  on_status: Callable[[int, int, dict[str, int]], None],
                  on_gone: Callable[[], None]) -> None:
    """Read the old process's status until it exits (its end of the link closes)."""
    link = inh.link

    def readable() -> None:
        try:
            data = link.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(link.fileno())
            link.close()
            on_gone()
            return
        try:
            msgs = inh.reader.feed(data)
        except ValueError as e:
            log.warning("hot restart: bad status from the old process: %s; no longer "
                        "following it", e)
            loop.remove_reader(link.fileno())
            link.close()
            on_gone()
            return
        for msg in msgs:
            if msg["op"] == "status":
                on_status(int(msg["connections"]), int(msg.get("draining", 0)),
                          {str(k): int(v) for k, v in msg["counters"].items()})

    loop.add_reader(link.fileno(), readable)


# -- the running process's side (asyncio) ---------------------------------------------------


class Source(Protocol):
    """What the running process offers a successor (the server)."""

    epoch: int
    started_all: float  # wall time the first epoch started
    config_path: str | None  # absolute as given: a successor must come with the same one

    def handover_sockets(self) -> tuple[list[tuple[str, str, HasFileno]],
                                        tuple[str, HasFileno] | None]:
        """[(listener name, configured address, listening socket)], (admin address, socket)."""
        ...

    def listener_definitions(self) -> dict[str, Any]:
        """Every listener's config, by name: the successor tells added/modified/removed."""
        ...

    def handover_quic(self) -> list[tuple[str, str, HasFileno, dict[int, HasFileno]]]:
        """[(listener name, configured address, UDP socket, {route (generation mark and
        worker): the socket that process's QUIC packets are forwarded to})]: this process's
        among them."""
        ...

    def quic_handed_over(self, names: list[str]) -> None:
        """The successor reads these listeners' UDP sockets now: stop reading them."""
        ...

    def counters(self) -> dict[str, int]: ...

    def connections(self) -> int: ...

    def draining_listeners(self) -> int:
        """Listeners with connections still open (they drain here)."""
        ...

    def hand_over(self) -> None:
        """The successor is ready: stop accepting (listeners, admin) and drain."""
        ...


class Rendezvous:
    """The running process's end: waits for a successor on the Unix socket at ``path``."""

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop, source: Source) -> None:
        self.path = path
        self.loop = loop
        self.source = source
        self.sock: socket.socket | None = None
        self.children: dict[int, tuple[socket.socket, _Reader]] = {}
        self.successor: socket.socket | None = None
        self.pending: socket.socket | None = None  # has the sockets, not yet ready
        self.handed_over = False
        self.status_timer: asyncio.TimerHandle | None = None
        self.outbox = bytearray()  # status bytes the successor has not taken yet
        self.inode: tuple[int, int] | None = None  # the path we bound, to unlink only it

    def start(self) -> None:
        d = os.path.dirname(self.path)
        if d:
            os.makedirs(d, mode=0o700, exist_ok=True)
            _check_dir(d)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # stale (a process that died), or the old one's, released
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            s.bind(self.path)  # created 0600: only our user may hand our sockets around
        finally:
            os.umask(old)
        st = os.stat(self.path)
        self.inode = (st.st_dev, st.st_ino)
        s.listen(8)
        s.setblocking(False)
        self.sock = s
        self.loop.add_reader(s.fileno(), self._accept)

    def _stop_listening(self, unlink: bool) -> None:
        s = self.sock
        if s is None:
            return
        self.sock = None
        self.loop.remove_reader(s.fileno())
        s.close()
        if unlink:
            # only the socket we bound: a successor may have bound the path anew meanwhile
            with contextlib.suppress(OSError):
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == self.inode:
                    os.unlink(self.path)

    def _accept(self) -> None:
        if self.sock is None:
            return
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        self.children[conn.fileno()] = (conn, _Reader())
        self.loop.add_reader(conn.fileno(), self._readable, conn)

    def _drop(self, conn: socket.socket) -> None:
        fd = conn.fileno()
        if fd >= 0:
            self.loop.remove_reader(fd)
            if conn is self.successor:
                self.loop.remove_writer(fd)
            self.children.pop(fd, None)
        if conn is self.pending:
            self.pending = None
        conn.close()

    def _readable(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        entry = self.children.get(conn.fileno())
        if not data or entry is None:
            if not self.handed_over:
                log.warning("hot restart: the new process went away before it was ready; "
                            "this one keeps serving")
            self._drop(conn)
            return
        try:
            msgs = entry[1].feed(data)
        except ValueError as e:
            log.warning("hot restart: %s", e)
            self._drop(conn)
            return
        for msg in msgs:
            if msg["op"] == "who":
                self._whoami(conn)
                return
            if msg["op"] == "hello":
                if self.pending is not None or self.handed_over or not _peer_is_us(conn):
                    # one successor at a time: two would both serve, one never drained
                    self._refuse(conn, "another new process is taking over")
                    return
                mine, theirs = self.source.config_path, msg.get("config")
                if theirs != mine:
                    self._refuse(conn, f"pid {os.getpid()} serves config {mine}, not "
                                       f"{theirs}: a hot restart replaces the same service "
                                       f"(the same config path)")
                    return
                self._send_sockets(conn, int(msg.get("pid", 0)))
            elif msg["op"] == "drain" and conn is self.pending and not self.handed_over:
                taken = msg.get("quic", [])
                self._release(conn, [str(n) for n in taken] if isinstance(taken, list) else [])

    def _whoami(self, conn: socket.socket) -> None:
        """A plain `lameduck run` asking before it refuses to start: answer, change nothing."""
        conn.settimeout(1.0)
        with contextlib.suppress(OSError):
            conn.sendall(_frame({"op": "whoami", "pid": os.getpid(),
                                 "config": self.source.config_path}))
        self._drop(conn)

    def _refuse(self, conn: socket.socket, why: str) -> None:
        log.warning("hot restart: refused a new process: %s", why)
        conn.settimeout(1.0)
        with contextlib.suppress(OSError):
            conn.sendall(_frame({"op": "refused", "why": why}))
        self._drop(conn)

    def _send_sockets(self, conn: socket.socket, pid: int) -> None:
        src = self.source
        listeners, admin = src.handover_sockets()
        quic = src.handover_quic()
        fds = [s.fileno() for _, _, s in listeners] + ([admin[1].fileno()] if admin else [])
        for _, _, udp, forward in quic:
            fds += [udp.fileno(), *(out.fileno() for out in forward.values())]
        msg = {"op": "sockets", "epoch": src.epoch, "pid": os.getpid(),
               "listeners": [[name, addr] for name, addr, _ in listeners],
               "admin": admin[0] if admin else None, "counters": src.counters(),
               "started": src.started_all, "definitions": src.listener_definitions(),
               "quic": [[name, addr, list(forward)] for name, addr, _, forward in quic]}
        data = _frame(msg)
        # One message, once; bounded, so a successor that does not read cannot stall us. The
        # descriptors ride its first bytes, FDS_PER_SEND per byte: the kernel takes at most
        # SCM_MAX_FD (253) in one sendmsg (unix(7)), and a group of sockets per worker, each
        # with its forwarding sockets, passes that; the successor gathers them as it reads.
        chunks = [fds[i:i + FDS_PER_SEND] for i in range(0, len(fds), FDS_PER_SEND)]
        assert len(chunks) < len(data)
        conn.settimeout(2.0)
        try:
            for i, chunk in enumerate(chunks):
                socket.send_fds(conn, [data[i:i + 1]], chunk)
            conn.sendall(data[len(chunks):])
        except OSError as e:
            log.warning("hot restart: could not hand the sockets to pid %d: %s", pid, e)
            self._drop(conn)
            return
        finally:
            if conn.fileno() >= 0:
                conn.setblocking(False)
        self.pending = conn
        log.info("hot restart: sockets handed to pid %d; waiting for it to be ready", pid)

    def _release(self, conn: socket.socket, quic: list[str]) -> None:
        self.handed_over = True
        self.successor = conn
        self.pending = None
        self._stop_listening(unlink=False)  # the successor binds the path anew
        for other, _ in list(self.children.values()):
            if other is not conn:
                self._drop(other)  # a second would-be successor: too late
        self.source.quic_handed_over(quic)
        self.source.hand_over()
        self._send(conn, {"op": "released"})
        self._status()

    def _send(self, conn: socket.socket, msg: dict[str, Any]) -> None:
        """Queue a whole frame and write what the socket takes; the rest goes when it is
        writable (a frame cut in two would corrupt the link)."""
        self.outbox += _frame(msg)
        self._flush_outbox(conn)

    def _flush_outbox(self, conn: socket.socket) -> None:
        if conn.fileno() < 0:
            return
        try:
            n = conn.send(self.outbox)
        except BlockingIOError:
            n = 0
        except OSError:
            self.outbox.clear()
            return
        del self.outbox[:n]
        if self.outbox:
            self.loop.add_writer(conn.fileno(), self._flush_outbox, conn)
        else:
            self.loop.remove_writer(conn.fileno())

    def _status(self) -> None:
        self.status_timer = None
        conn = self.successor
        if conn is None or conn.fileno() < 0:
            return
        if not self.outbox:  # the successor is behind: skip this one, the next follows
            self._send(conn, {"op": "status", "connections": self.source.connections(),
                              "draining": self.source.draining_listeners(),
                              "counters": self.source.counters()})
        self.status_timer = self.loop.call_later(STATUS_EVERY, self._status)

    def close(self) -> None:
        """At exit: a last status to the successor, then let go of everything."""
        if self.status_timer is not None:
            self.status_timer.cancel()
            self.status_timer = None
        if self.successor is not None and self.successor.fileno() >= 0:
            conn = self.successor
            self.loop.remove_writer(conn.fileno())
            conn.settimeout(1.0)  # at exit: bounded, and after whatever was queued
            with contextlib.suppress(OSError):
                conn.sendall(bytes(self.outbox) + _frame(
                    {"op": "status", "connections": 0, "draining": 0,
                     "counters": self.source.counters()}))
            self.outbox.clear()
            self._drop(conn)
        for conn, _ in list(self.children.values()):
            self._drop(conn)
        self._stop_listening(unlink=not self.handed_over)
