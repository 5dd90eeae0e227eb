"""`lameduck run`: one process's start-up, from the command line to its exit code.

In order: a signal that arrives while starting waits for the start to finish; the soft
descriptor limit is raised to the hard one (server/limits.py); the config; a
plain start refuses where another lameduck serves (its hot-restart socket or admin address);
the admin address file is opened; sockets passed by systemd are matched to listeners; the demo
origin starts (no -c); a hot restart takes the running process's sockets; the ``Server`` (with
``workers: N``, over a worker pool) binds what it still needs and serves; the banner; then the
exit code the drain ends with.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lameduck.config import Config, ConfigError, HostPort, default_config, load_config
from lameduck.listeners.base import Listener, downstream_cap
from lameduck.restart import Notifier, listen_fds, match_listeners
from lameduck.restart.hot import connect_parent, default_path
from lameduck.restart.supervisor import SUPERVISOR_ENV
from lameduck.server.lifecycle import run_loop
from lameduck.server.limits import raise_nofile
from lameduck.server.running import refusal
from lameduck.server.server import SIGNALS, Server
from lameduck.server.workers import worker_count

log = logging.getLogger("lameduck")

EXIT_CONFIG = 2  # the config is invalid, or an option does not fit it
EXIT_LISTEN = 1  # could not start: an address in use, another lameduck serving here


@dataclass(frozen=True)
class DemoOrigin:
    """The demo's origin, served in this process beside the proxy when there is no -c (the
    command passes it in: the demo is not the server's to import)."""

    start: Callable[[str, int], Awaitable[asyncio.AbstractServer]]
    stop: Callable[[asyncio.AbstractServer, float], Awaitable[None]]


@dataclass(frozen=True)
class RunOptions:
    """What `lameduck run` was given. ``log_argv``: the global log options as given, for the
    processes this one starts (workers, a hot-restart successor): they log the way it does."""

    config: str | None  # None: the embedded default, with the demo origin
    hot_restart: bool = False
    admin_address_path: str | None = None
    log_file: str | None = None
    log_argv: Sequence[str] = ()
    demo_origin: DemoOrigin | None = None


@dataclass
class _Start:
    """What the checks before the event loop found."""

    cfg: Config
    config_path: str  # absolute as given; "" for the demo
    restart_path: str | None
    address_file: AddressFile | None
    sockets: dict[str, Any]  # listener name → socket passed by systemd

    @property
    def demo(self) -> bool:
        return self.config_path == ""


def load_config_or_default(path: str | None) -> Config:
    """``-c PATH``, or the embedded default without it; ConfigError when invalid."""
    return default_config() if path is None else load_config(path)


def load_or_report(path: str | None) -> Config | None:
    """The config, or None after saying on stderr why it is invalid (the caller exits 2)."""
    try:
        return load_config_or_default(path)
    except ConfigError as e:
        print(f"lameduck: invalid config\n{e}", file=sys.stderr)
        return None


def run(opts: RunOptions) -> int:
    """`lameduck run` to its end: the exit code (docs/drain.md: 0, 3 cut, 2 config, 1 could
    not start)."""
    # What arrives while starting waits for the start to finish (a supervisor's SIGTERM during
    # a hot restart, a SIGHUP): the default actions would kill the process with connections
    # it had accepted on sockets it shares with the old one.
    early: list[signal.Signals] = []
    previous = {sig: signal.signal(sig, lambda n, _f: early.append(signal.Signals(n)))
                for sig in SIGNALS}
    try:
        raise_nofile()
        # the cap is derived from the limit when listeners/ is imported, before the raise
        Listener.cap = downstream_cap()
        prepared = _prepare(opts)
        if isinstance(prepared, int):
            return prepared
        start = prepared
        try:
            return run_loop(lambda: _serve(opts, start, early))
        finally:
            if start.address_file is not None:
                start.address_file.discard()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _prepare(opts: RunOptions) -> _Start | int:
    """Everything checked before the event loop runs: a _Start, or the exit code of a start
    refused (said on stderr)."""
    cfg = load_or_report(opts.config)
    if cfg is None:
        return EXIT_CONFIG
    demo = opts.config is None
    config_path = "" if opts.config is None else os.path.abspath(opts.config)
    path = None if demo else restart_path(cfg)
    if opts.hot_restart and demo:
        print("lameduck: --hot-restart needs -c: the demo (no -c) cannot hand its sockets "
              "over", file=sys.stderr)
        return EXIT_CONFIG
    if opts.hot_restart and path is None:
        print("lameduck: --hot-restart: admin.address is on port 0, so there is no default "
              "hot-restart socket; set hot_restart.socket", file=sys.stderr)
        return EXIT_CONFIG
    if not opts.hot_restart:
        try:
            refused = refusal(cfg, path)
        except OSError as e:
            print(f"lameduck: hot-restart socket {path}: {e}", file=sys.stderr)
            return EXIT_LISTEN
        if refused is not None:
            print(f"lameduck: not started: {refused}", file=sys.stderr)
            return EXIT_LISTEN
    address_file = None
    if opts.admin_address_path:
        try:
            address_file = AddressFile(opts.admin_address_path)
        except OSError as e:
            print(f"lameduck: cannot write the admin address to {opts.admin_address_path}: "
                  f"{e}", file=sys.stderr)
            return EXIT_LISTEN
    try:
        sockets = match_listeners(cfg.listeners, listen_fds())
    except ValueError as e:
        print(f"lameduck: socket activation: {e}", file=sys.stderr)
        if address_file is not None:
            address_file.discard()
        return EXIT_LISTEN
    return _Start(cfg, config_path, path, address_file, sockets)


async def _serve(opts: RunOptions, start: _Start, early: list[signal.Signals]) -> int:
    """In the event loop: the demo origin, the hot restart's handover, the Server; the exit
    code once it is done."""
    cfg = start.cfg
    demo = opts.demo_origin if start.demo else None
    origin = None
    if demo is not None:
        ep = cfg.clusters[0].endpoints[0].address
        try:
            origin = await demo.start(ep.host, ep.port)
        except OSError as e:
            # A port already taken is an operator's problem, not a traceback.
            print(f"lameduck: cannot start the demo origin on {ep}: {e}", file=sys.stderr)
            return EXIT_LISTEN
        log.info("demo origin on %s", ep)
    inherited = None
    if opts.hot_restart and start.restart_path is not None:
        try:
            inherited = connect_parent(start.restart_path, start.config_path)
        except (OSError, ValueError) as e:
            print(f"lameduck: hot restart from {start.restart_path} failed: {e}",
                  file=sys.stderr)
            return EXIT_LISTEN
        if inherited is not None:
            log.info("hot restart: took the sockets of pid %d (epoch %d)",
                     inherited.parent_pid, inherited.epoch)
        else:
            log.info("hot restart: no lameduck serves %s; starting afresh", start.restart_path)
    server = Server(cfg, sockets=start.sockets, notifier=Notifier(), inherited=inherited,
                    restart_path=start.restart_path, config_path=start.config_path,
                    successor_argv=None if start.demo else successor_argv(opts,
                                                                          start.config_path),
                    workers=worker_count(cfg.workers), worker_argv=worker_argv(opts))
    loop = asyncio.get_running_loop()
    for sig in SIGNALS:
        loop.add_signal_handler(sig, early.append, sig)
    address_file = start.address_file

    def publish() -> None:
        """The admin address, once bound (after a hot restart's handover, the admin socket
        is ours) and before readiness is signalled."""
        if address_file is None:
            return
        try:
            address_file.write(server.admin_address())
        except OSError as e:
            log.error("cannot write the admin address to %s: %s", address_file.path, e)

    try:
        await server.start(publish)
    except OSError as e:
        print(f"lameduck: cannot listen: {e}", file=sys.stderr)
        if demo is not None and origin is not None:
            await demo.stop(origin, 0.0)
        return EXIT_LISTEN
    server.install_signal_handlers()
    admin = server.admin_address()
    bound = {name: str(HostPort(host, port))
             for name, host, port in server.listener_addresses()}
    print(banner(cfg, start.demo, admin, bound, os.getpid(), supervisor_pid()),
          file=sys.stderr, flush=True)
    for sig in early:
        server.handle_signal(sig)
    code = await server.done
    if demo is not None and origin is not None:
        await demo.stop(origin, 0.2)
    return code


def restart_path(cfg: Config) -> str | None:
    """Where this config's hot restart meets (None: admin on port 0 and none configured)."""
    a = cfg.admin.address
    return cfg.hot_restart.socket or default_path(a.host, a.port)


def successor_argv(opts: RunOptions, config: str) -> list[str]:
    """The command line SIGHUP starts: this one's, with ``--hot-restart``."""
    argv = [sys.executable, "-m", "lameduck", *opts.log_argv, "run", "-c", config,
            "--hot-restart"]
    if opts.admin_address_path:
        argv += ["--admin-address-path", os.path.abspath(opts.admin_address_path)]
    if opts.log_file:
        argv += ["--log-file", os.path.abspath(opts.log_file)]
    return argv


def worker_argv(opts: RunOptions) -> list[str]:
    """A worker's log options: this process's, and its log file."""
    argv = list(opts.log_argv)
    if opts.log_file:
        argv += ["--log-file", os.path.abspath(opts.log_file)]
    return argv


def supervisor_pid() -> int | None:
    """The pid of the `lameduck supervise` this process is a child of, or None. The supervisor
    names itself in SUPERVISOR_ENV; it counts only while it is still our parent (the variable
    is inherited by whatever a child starts)."""
    try:
        pid = int(os.environ.get(SUPERVISOR_ENV, ""))
    except ValueError:
        return None
    return pid if pid == os.getppid() else None


def banner(cfg: Config, demo: bool, admin: str, bound: dict[str, str], pid: int,
           supervisor: int | None = None) -> str:
    """What to try, at the addresses bound (``bound``: listener name → host:port; a port 0
    in the config shows as the port the kernel gave). Under `lameduck supervise`
    (``supervisor``: its pid) the signals go to the supervisor: a child that exits on its own
    is restarted, and one that hot-restarts itself leaves a successor the supervisor does not
    know."""
    lines = ["", "lameduck is running" + (" on its embedded default config" if demo else "")]
    for ls in cfg.listeners:
        base = f"http://{bound.get(ls.name, ls.address)}"
        lines.append(f"  listener {ls.name}: {base}/")
        if demo:
            lines.append(f"    try:  curl -i {base}/   |   curl -i '{base}/sleep?ms=3000'"
                         f"   |   curl -N {base}/stream")
        if ls.health_check_path:
            lines.append(f"    health check: {base}{ls.health_check_path}")
    lines += [
        f"  admin: http://{admin}/   (stats: http://{admin}/stats, ready: http://{admin}/ready)",
        "  start a graceful drain:",
        f"    curl -X POST 'http://{admin}/drain_listeners?graceful&skip_exit'",
    ]
    if supervisor is None:
        lines += [
            f"  or stop it the way Kubernetes does: kill -TERM {pid} (drains, then exits)",
            f"  hot-restart it with the config re-read: kill -HUP {pid}",
        ]
    else:
        lines += [
            f"  this is child {pid} of lameduck supervise (pid {supervisor}): signal the "
            "supervisor, not the child (a child stopped alone is restarted)",
            f"  stop it (drains, then exits): docker stop <container> (or systemctl stop, "
            f"kubectl delete pod), or kill -TERM {supervisor}",
            f"  hot-restart it with the config re-read: kill -HUP {supervisor} "
            "(docker kill --signal=HUP <container>)",
        ]
    lines.append("")
    return "\n".join(lines)


class AddressFile:
    """Envoy's ``--admin-address-path``: the admin address is written to this file once it is
    bound, so a config with ``admin.address`` on port 0 can be found. Written atomically (a
    temporary file in the same directory, then a rename): a reader sees no file or the whole
    address, never a part. The temporary file is opened before the server starts, so a path
    that cannot be written fails the start instead of leaving nobody able to find the port."""

    def __init__(self, path: str) -> None:
        self.path = path
        d, base = os.path.split(os.path.abspath(path))
        fd, self.tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=d)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as an ordinary file (mkstemp makes it 0600)
        self.f = os.fdopen(fd, "w", encoding="utf-8")
        self.written = False

    def write(self, address: str) -> None:
        with self.f:
            self.f.write(address + "\n")
        os.replace(self.tmp, self.path)
        self.written = True

    def discard(self) -> None:
        """The temporary file of a start that failed (or of a write that did)."""
        self.f.close()
        if not self.written:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
