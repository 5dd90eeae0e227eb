"""systemd without libsystemd: ``Type=notify`` readiness and socket activation.

The two protocols are small and stable (sd_notify(3), sd_listen_fds(3)): a datagram of
``KEY=VALUE`` lines to the Unix socket named by ``NOTIFY_SOCKET`` (``@`` for the abstract
namespace), and listening sockets inherited from fd 3 on, counted by ``LISTEN_FDS``, named
by ``LISTEN_FDNAMES`` and meant for us only if ``LISTEN_PID`` is our pid. An inherited socket
is what makes a restart under systemd refuse no connection: the kernel queues new ones while
no process accepts.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass

from lameduck.config import ListenerConfig

log = logging.getLogger("lameduck.systemd")

LISTEN_FDS_START = 3


class Notifier:
    """Sends sd_notify states; does nothing when not started by systemd (no NOTIFY_SOCKET)."""

    def __init__(self, env: MutableMapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        # Children (an origin started by `lameduck run`, a hot-restarted process) must not
        # report for us: unset, as sd_notify(unset_environment=1) does.
        env.pop("NOTIFY_SOCKET", None)
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        elif not addr.startswith("/"):
            addr = ""  # unset, or a transport we do not speak (vsock)
        self.address = addr

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *states: str) -> bool:
        """One datagram with ``states`` (e.g. ``READY=1``); False if not sent."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.connect(self.address)
                s.sendall("\n".join(states).encode())
        except OSError as e:
            log.warning("sd_notify to %r failed: %s", self.address, e)
            return False
        return True

    def ready(self) -> bool:
        return self.send("READY=1", f"MAINPID={os.getpid()}", "STATUS=serving")

    def stopping(self, why: str) -> bool:
        return self.send("STOPPING=1", f"STATUS=draining ({why})")


@dataclass(frozen=True)
class PassedSocket:
    fd: int
    name: str  # LISTEN_FDNAMES entry (systemd's FileDescriptorName=; "unknown" if none)
    sock: socket.socket


def listen_fds(env: MutableMapping[str, str] | None = None) -> list[PassedSocket]:
    """The listening sockets systemd passed us; the variables are unset (they describe this
    process, not its children). Raises ValueError for variables that cannot be trusted."""
    env = os.environ if env is None else env
    pid, fds, names = env.get("LISTEN_PID"), env.get("LISTEN_FDS"), env.get("LISTEN_FDNAMES")
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(key, None)
    if not pid or not fds:
        return []
    if not pid.isdigit() or not fds.isdigit():
        raise ValueError(f"LISTEN_PID={pid!r} LISTEN_FDS={fds!r}: not numbers")
    if int(pid) != os.getpid():
        return []  # meant for another process (we were started by one that got them)
    n = int(fds)
    labels = names.split(":") if names else []
    out = []
    for i in range(n):
        fd = LISTEN_FDS_START + i
        try:
            sock = socket.socket(fileno=fd)
        except OSError as e:
            raise ValueError(f"LISTEN_FDS={n}: fd {fd} is not a socket ({e})") from e
        sock.set_inheritable(False)
        if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ValueError(f"fd {fd} passed by systemd is not a listening stream socket")
        label = labels[i] if i < len(labels) and labels[i] else "unknown"
        out.append(PassedSocket(fd, label, sock))
    return out


def _same_address(sock: socket.socket, host: str, port: int) -> bool:
    """Whether ``sock`` listens where a listener configured as host:port would. A dual-stack
    IPv6 wildcard (systemd's ``ListenStream=8080``) also stands for ``0.0.0.0``."""
    try:
        bound = sock.getsockname()
        want = ipaddress.ip_address(host)
    except (OSError, ValueError):
        return False
    if not isinstance(bound, tuple) or bound[1] != port:
        return False
    try:
        got = ipaddress.ip_address(str(bound[0]).split("%", 1)[0])
    except ValueError:
        return False
    if got == want:
        return True
    if isinstance(got, ipaddress.IPv6Address) and got.ipv4_mapped == want:
        return True
    if got.is_unspecified and want.is_unspecified and sock.family == socket.AF_INET6:
        return not sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
    return False


def match_listeners(listeners: Iterable[ListenerConfig],
                    passed: list[PassedSocket]) -> dict[str, socket.socket]:
    """listener name → the passed socket it serves on: the one named after it
    (``FileDescriptorName=``), else the one bound to its address. A passed socket no listener
    takes is closed, with a warning (the kernel would otherwise queue connections nobody
    accepts)."""
    out: dict[str, socket.socket] = {}
    left = list(passed)
    listeners = list(listeners)
    for lc in listeners:
        for p in left:
            if p.name == lc.name:
                out[lc.name] = p.sock
                left.remove(p)
                break
    for lc in listeners:
        if lc.name in out:
            continue
        for p in left:
            if _same_address(p.sock, lc.address.host, lc.address.port):
                out[lc.name] = p.sock
                left.remove(p)
                break
    for p in left:
        log.warning("socket passed by systemd (fd %d, name %s, %s) matches no listener: closed",
                    p.fd, p.name, p.sock.getsockname())
        p.sock.close()
    return out


def pass_listen_fds(fds: list[tuple[int, str]],
                    env: MutableMapping[str, str] | None = None) -> None:
    """Do what systemd does between fork and exec (sd_listen_fds(3)), in the process that is to
    serve the listening sockets ``fds`` [(fd, name)]: move them to fd 3, 4, ... and set
    ``LISTEN_FDS``, ``LISTEN_FDNAMES`` and ``LISTEN_PID`` (this process), so that
    ``listen_fds`` finds them. How `lameduck supervise` hands its sockets to a child."""
    env = os.environ if env is None else env
    # out of the way first, so moving one onto 3+i never clobbers another
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3 + len(fds)) for fd, _ in fds]
    for fd, _ in fds:
        os.close(fd)
    for i, fd in enumerate(high):
        os.dup2(fd, LISTEN_FDS_START + i, inheritable=False)
        os.close(fd)
    env["LISTEN_FDS"] = str(len(fds))
    env["LISTEN_FDNAMES"] = ":".join(name for _, name in fds)
    env["LISTEN_PID"] = str(os.getpid())
