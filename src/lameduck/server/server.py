"""One lameduck process: a data plane (its own listeners, or a pool of worker processes), the
lifecycle over it (``server.lifecycle``), and the shell around both: the listening sockets
(bound, passed by systemd, or taken over in a hot restart), the admin API, signals and the hot
restart's two sides.

What it runs is built from the config by ``server.build`` (no sockets there); the admin API
reaches it through ``AdminControl``, a hot-restart successor through ``restart.hot.Source``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from lameduck.admin import AdminHandlers, start_admin
from lameduck.admin.control import NotFound
from lameduck.config import Config, ConfigError, format_duration, load_config
from lameduck.drain import Cause
from lameduck.drain.endpoint import AdminState
from lameduck.listeners.http import HttpListener
from lameduck.restart import Notifier
from lameduck.restart.hot import HasFileno, Inherited, Rendezvous, follow_parent, take_over
from lameduck.server.build import build
from lameduck.server.lifecycle import DataPlane, Lifecycle
from lameduck.server.local import LocalPlane
from lameduck.server.logfile import logger_levels, reopen_log_files, set_log_level
from lameduck.server.pool import WorkerPool
from lameduck.server.successor import Successor
from lameduck.server.views import (
    config_dump,
    fmt_addr,
    listener_addresses,
    server_info,
)
from lameduck.stats import Stat

log = logging.getLogger("lameduck")

# What `lameduck run` does with each signal (README.md, "Signals"); any other keeps its
# default action.
SIGNALS = (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
           signal.SIGUSR2)


class Server:
    """One lameduck process. ``workers`` > 1: the data plane runs in that many worker
    processes (started with ``worker_argv``, the log options), this one keeps control."""

    def __init__(self, cfg: Config, loop: asyncio.AbstractEventLoop | None = None,
                 sockets: dict[str, socket.socket] | None = None,
                 notifier: Notifier | None = None, inherited: Inherited | None = None,
                 restart_path: str | None = None, config_path: str | None = None,
                 successor_argv: list[str] | None = None, workers: int = 1,
                 worker_argv: Sequence[str] = ()) -> None:
        # listener name → a listening socket handed to us (systemd socket activation)
        self.sockets = sockets or {}
        # what the previous process handed over (hot restart), and where we wait for the next
        self.inherited = inherited
        self.restart_path = restart_path
        # the config file, absolute as given ('' for the embedded default): a successor must
        # come with the same one; SIGHUP starts ``successor_argv`` (None: no hot restart)
        self.config_path = config_path
        self.successor_argv = successor_argv
        self.successor: Successor | None = None
        self.rendezvous: Rendezvous | None = None
        self.epoch = inherited.epoch if inherited is not None else 0
        self.parent_draining = 0  # the previous process's listeners still draining
        self.notifier = notifier if notifier is not None else Notifier({})
        self.cfg = cfg
        self.loop = loop or asyncio.get_running_loop()
        self.rng = random.random
        built = build(cfg, self.loop, self.rng, self._changed)
        self.process = built.process
        self.registry = built.registry
        self.server_stats = built.server_stats
        self.drain_stats = built.drain_stats
        self.lm_stats = built.lm_stats
        self.clusters = built.clusters
        self.checkers = built.checkers
        self.listeners = built.listeners
        self.plane: DataPlane = (
            LocalPlane(self.loop, built) if workers <= 1
            else WorkerPool(self.loop, cfg, built, workers, list(worker_argv), inherited,
                            self._changed))
        self.started_mono = self.loop.time()
        self.started_wall = time.time()
        self.started_all = inherited.started if inherited is not None else self.started_wall
        self.server_stats.hot_restart_epoch = self.epoch
        if inherited is not None:
            self.registry.carried = dict(inherited.counters)  # stats do not reset
        self.admin: asyncio.AbstractServer | None = None
        self._housekeeping: asyncio.TimerHandle | None = None
        self._sigint_count = 0
        self.lifecycle = Lifecycle(cfg, self.loop, self.process, self.plane, self.server_stats,
                                   self.drain_stats, self.notifier, self._closed,
                                   self.started_mono, self.started_wall)
        self.done = self.lifecycle.done

    def _changed(self) -> None:
        """A connection closed, a request ended (every request: a bare test while nothing
        drains), a worker reported: maybe the drain is over."""
        if self.process.shutdown is not None:
            self.lifecycle.changed()

    # -- start ------------------------------------------------------------------------------
    async def start(self, before_ready: Callable[[], None] | None = None) -> None:
        """``before_ready``: called once everything is bound and serving, before readiness is
        signalled (systemd, a supervisor), e.g. to publish the bound admin address."""
        # Every socket first (inherited, passed by systemd, or bound here), then serve: a
        # failure (an address taken) must come before this process accepts any connection,
        # or a hot restart that fails would drop what it had accepted.
        inh = self.inherited
        socks: list[socket.socket] = []
        try:
            for listener in self.listeners:
                sock = self._inherited_socket(listener.name, str(listener.cfg.address))
                if sock is None:
                    sock = self.sockets.pop(listener.name, None)
                    if sock is not None:
                        listener.socket_shared = True
                        log.info("listener %s takes the socket passed by systemd",
                                 listener.name)
                if sock is None:
                    sock = self.plane.bind(listener)
                sock.setblocking(False)
                socks.append(sock)
                if isinstance(listener, HttpListener):
                    self._inherit_quic(listener)
            a = self.cfg.admin.address
            admin_sock = None
            if inh is not None and inh.admin is not None and inh.admin[0] == str(a):
                admin_sock = inh.admin[1]
                inh.admin = None
                admin_sock.setblocking(False)
            self.admin = await start_admin(self.loop, AdminHandlers(self), a.host, a.port,
                                           sock=admin_sock,
                                           token_file=self.cfg.admin.token_file)
        except OSError:
            for sock in socks:
                sock.close()
            raise
        before = inh.definitions if inh is not None else {}
        for listener, sock in zip(self.listeners, socks, strict=True):
            await self.plane.serve(listener, sock)
            log.info("listener %s on %s", listener.name, fmt_addr(listener.sockname))
            # Envoy's LDS words, against the process before this one (hot restart)
            old = before.get(listener.name)
            if old is None:
                self.lm_stats.listener_added += 1
            elif old != listener.cfg.model_dump(mode="json"):
                self.lm_stats.listener_modified += 1
        await self.plane.serving()
        names = {ls.name for ls in self.listeners}
        self.lm_stats.listener_removed += sum(1 for name in before if name not in names)
        self.lm_stats.total_listeners_active = len(self.listeners)
        log.info("admin on %s", fmt_addr(self.admin.sockets[0].getsockname()))
        self.process.initialized()
        self._housekeeping = self.loop.call_later(1.0, self._housekeep)
        for checker in self.checkers:
            checker.start()
        if inh is not None:
            await self._take_over(inh)
        if not self.admin.is_serving():  # the handed-over admin socket: ours from now on
            await self.admin.start_serving()
        if self.restart_path is not None:
            self.rendezvous = Rendezvous(self.restart_path, self.loop, self)
            self.rendezvous.start()
        if before_ready is not None:
            before_ready()
        self.notifier.ready()

    def _inherited_socket(self, name: str, address: str) -> socket.socket | None:
        """The previous process's listening socket for this listener, if its address is the
        same (a listener moved elsewhere binds anew; the old one drains in the old process)."""
        inh = self.inherited
        if inh is None or name not in inh.listeners:
            return None
        addr, sock = inh.listeners.pop(name)
        if addr != address:
            sock.close()
            return None
        log.info("listener %s takes over the socket of pid %d", name, inh.parent_pid)
        return sock

    def _inherit_quic(self, listener: HttpListener) -> None:
        """HTTP/3: the epoch marks the connection ids issued here; the previous process's
        UDP socket, if its address is the same, is read here from now on, and the packets
        of the older processes' connections are forwarded to them (listeners.quic)."""
        listener.generation = self.epoch
        inh = self.inherited
        if inh is None or listener.cfg.http3 is None:
            return
        address = str(listener.cfg.address)
        name = listener.name
        taken = inh.take_quic(name, address)
        if taken is None:  # renamed over the restart: the same port's sockets all the same
            renamed = inh.renamed_quic(address, {ln.name for ln in self.cfg.listeners})
            if renamed is not None:
                name, taken = renamed
        if taken is not None:
            listener.quic_socket, listener.quic_forward = taken
            # the rest of the port's SO_REUSEPORT group (one socket per worker there)
            i = 1
            while (more := inh.take_quic(f"{name}@{i}", address)) is not None:
                listener.quic_extra.append(more[0])
                listener.quic_forward.update(more[1])
                i += 1
            log.info("listener %s takes over the UDP socket%s of pid %d (HTTP/3; packets of "
                     "%d older process(es) or worker(s) forwarded)", listener.name,
                     "s" if i > 1 else "", inh.parent_pid, len(listener.quic_forward))

    async def _take_over(self, inh: Inherited) -> None:
        """Ready: the previous process stops accepting and drains; we follow its status."""
        inh.close_unused()  # listeners that are gone: they drain in the old process
        try:
            await take_over(inh, self.loop)
        except (OSError, TimeoutError) as e:
            log.warning("hot restart: pid %d did not release: %s (serving anyway)",
                        inh.parent_pid, e)
            inh.link.close()
            return
        log.info("hot restart: epoch %d serving; pid %d drains", inh.epoch, inh.parent_pid)
        self.server_stats.parent_connections = 1  # until its first status says how many

        def status(connections: int, draining: int, counters: dict[str, int]) -> None:
            self.server_stats.parent_connections = connections
            self.parent_draining = draining
            self.registry.carried = counters

        def gone() -> None:
            self.server_stats.parent_connections = 0
            self.parent_draining = 0
            log.info("hot restart: pid %d has exited", inh.parent_pid)

        follow_parent(inh, self.loop, status, gone)

    # -- hot restart: the side that hands over (restart.hot.Source) -------------------------
    def handover_sockets(self) -> tuple[list[tuple[str, str, HasFileno]],
                                        tuple[str, HasFileno] | None]:
        admin = (None if self.admin is None
                 else (str(self.cfg.admin.address), self.admin.sockets[0]))
        return self.plane.handover_sockets(), admin

    def handover_quic(self) -> list[tuple[str, str, HasFileno, dict[int, HasFileno]]]:
        return self.plane.handover_quic()

    def quic_handed_over(self, names: list[str]) -> None:
        self.plane.quic_handed_over(names)

    def listener_definitions(self) -> dict[str, Any]:
        return {lc.name: lc.model_dump(mode="json") for lc in self.cfg.listeners}

    def draining_listeners(self) -> int:
        return self.plane.draining_listeners()

    def counters(self) -> dict[str, int]:
        self._refresh_gauges()
        return self.plane.counters()

    def connections(self) -> int:
        """Downstream connections open, on every listener (in every worker)."""
        return self.plane.connections()

    def hand_over(self) -> None:
        """The new process is ready: stop accepting (it accepts on the same sockets), hand
        it the admin port, and drain; exit by parent_shutdown_time."""
        self.plane.hand_over()
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        self.begin_shutdown("hot restart", Cause.HOT_RESTART,
                            self.cfg.hot_restart.parent_shutdown_time)

    # -- signals (README.md, "Signals") ------------------------------------------------------
    def install_signal_handlers(self) -> None:
        for sig in SIGNALS:
            self.loop.add_signal_handler(sig, self.handle_signal, sig)

    def handle_signal(self, sig: signal.Signals) -> None:
        """Each signal is logged with what it does; none keeps its default action (SIGHUP,
        SIGQUIT, SIGUSR1 and SIGUSR2 would end the process at once)."""
        if sig in (signal.SIGTERM, signal.SIGQUIT):
            self._stop(sig.name)
        elif sig is signal.SIGINT:
            self._sigint()
        elif sig is signal.SIGHUP:
            self._sighup()
        elif sig is signal.SIGUSR1:
            paths = reopen_log_files()
            if paths:
                log.info("SIGUSR1: reopened the log file %s", ", ".join(paths))
            else:
                log.info("SIGUSR1: no --log-file (the log goes to stderr): nothing to reopen")
            self.plane.reopen_logs()
        else:
            log.info("%s: ignored (lameduck gives it no meaning)", sig.name)

    def _stop(self, name: str) -> None:
        if self.process.shutdown is not None:
            log.info("%s: already draining; exits by the deadline (%s after the drain "
                     "started)", name, format_duration(self.process.exit_after))
            return
        self.begin_shutdown(f"{name}: drain, then exit")

    def _sigint(self) -> None:
        self._sigint_count += 1
        if self._sigint_count == 1:
            self._stop("SIGINT (a second SIGINT exits at once)")
        else:
            self.quit("second SIGINT")

    def _sighup(self) -> None:
        """Hot restart into a new process with the config re-read; a config that does not
        load changes nothing."""
        if self.successor_argv is None or self.restart_path is None:
            why = ("the demo (no -c) cannot hand its sockets over" if self.config_path == ""
                   else "no hot-restart socket (admin.address on port 0 needs "
                        "hot_restart.socket)")
            log.warning("SIGHUP: ignored: %s", why)
            return
        if self.process.shutdown is not None:
            log.info("SIGHUP: ignored: this process is draining")
            return
        if self.successor is not None and self.successor.running:
            log.info("SIGHUP: ignored: a hot restart is already under way")
            return
        assert self.config_path
        try:
            load_config(self.config_path)
        except ConfigError as e:
            log.error("SIGHUP: config not valid, nothing changed:\n%s", e)
            return
        env = dict(os.environ)
        if self.notifier.address:  # the new process reports READY=1 with its MAINPID
            a = self.notifier.address
            env["NOTIFY_SOCKET"] = "@" + a[1:] if a.startswith("\0") else a
            self.notifier.send("RELOADING=1")
        self.successor = Successor(self.successor_argv, self.loop, self._successor_exited)
        try:
            pid = self.successor.start(env)
        except OSError as e:
            log.error("SIGHUP: cannot start the new process: %s; this one keeps serving", e)
            self.successor = None
            return
        log.info("SIGHUP: hot restart: started pid %d with %s; it takes the sockets once "
                 "ready, then this one drains and exits", pid, self.config_path)

    def _successor_exited(self, pid: int, code: int) -> None:
        if self.process.shutdown is None:
            log.error("SIGHUP: the new process pid %d exited with %d before taking over; "
                      "this one keeps serving", pid, code)
            self.notifier.ready()
        else:  # it drained faster than this one (restarts overlap)
            log.info("hot restart: pid %d, which took over from this one, exited with %d",
                     pid, code)

    def _housekeep(self) -> None:
        self.plane.housekeep()
        self._housekeeping = self.loop.call_later(1.0, self._housekeep)

    def begin_shutdown(self, why: str = "SIGTERM", cause: Cause = Cause.SHUTDOWN,
                       deadline: float | None = None, start: float | None = None) -> None:
        self.lifecycle.begin_shutdown(why, cause, deadline, start)

    def quit(self, why: str = "POST /quitquitquit") -> None:
        self.lifecycle.quit(why)

    def _closed(self) -> None:
        """The lifecycle's end, before ``done``: everything this process runs besides."""
        if self.admin is not None:
            self.admin.close()
        if self.rendezvous is not None:
            self.rendezvous.close()  # a last status to a successor; the path is left to it
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        if self.successor is not None:
            self.successor.close()  # the new process goes on without us
        for checker in self.checkers:
            checker.stop()

    # -- AdminControl -----------------------------------------------------------------------
    def drain_listeners(self, graceful: bool, skip_exit: bool, inbound_only: bool) -> None:
        self.lifecycle.drain_listeners(graceful, skip_exit, inbound_only)

    def healthcheck_fail(self) -> None:
        self.lifecycle.healthcheck_fail()

    def healthcheck_ok(self) -> None:
        self.lifecycle.healthcheck_ok()

    def state_name(self) -> str:
        return self.process.state.name

    def start_prestop(self, strategy: str, drain_timeout: float,
                      lb_buffer: float, leave: str = "timer") -> dict[str, Any]:
        return self.lifecycle.start_prestop(strategy, drain_timeout, lb_buffer, leave)

    def drain_reports(self, last: int | None) -> dict[str, Any]:
        return self.lifecycle.drain_reports(last)

    def clusters_view(self) -> list[dict[str, Any]]:
        return self.plane.clusters_view()

    def listener_addresses(self) -> list[tuple[str, str, int]]:
        return listener_addresses(self.listeners)

    def admin_address(self) -> str:
        """The admin API's bound ``host:port`` (an ephemeral port resolved)."""
        assert self.admin is not None
        return fmt_addr(self.admin.sockets[0].getsockname())

    def set_endpoint_state(self, cluster: str, address: str, state: str) -> None:
        c = self.clusters.get(cluster)
        if c is None:
            raise NotFound(f"no cluster {cluster!r} (clusters: {', '.join(self.clusters)})")
        ep = c.find(address)
        if ep is None:
            known = ", ".join(e.address for e in c.endpoints)
            raise NotFound(f"no endpoint {address!r} in cluster {cluster!r} ({known})")
        try:
            new = AdminState(state.lower())
        except ValueError:
            raise ValueError(f"unknown state {state!r}: use ready, drain or maint") from None
        log.info("cluster %s endpoint %s: %s -> %s (admin)", cluster, address,
                 ep.drain.state.value, new.value)
        c.set_state(ep, new, self.loop.time())

    def refresh(self) -> Awaitable[None] | None:
        return self.plane.refresh()

    def stats_snapshot(self) -> list[Stat]:
        self._refresh_gauges()
        return self.plane.stats_snapshot()

    def used_stats(self) -> set[str]:
        return self.registry.used

    def reset_counters(self) -> None:
        self._refresh_gauges()
        self.registry.reset_counters()
        log.info("admin: counters reset to 0")
        self.plane.reset_counters()

    def config_dump(self) -> dict[str, Any]:
        return config_dump(self.cfg, self.config_path, self.started_wall)

    def loggers(self) -> dict[str, str]:
        return logger_levels()

    def set_log_level(self, name: str | None, level: str) -> None:
        set_log_level(name, level)
        self.plane.set_log_level(name, level)

    def server_info(self) -> dict[str, Any]:
        info = server_info(
            self.process, self.cfg, self.config_path, now=self.loop.time(),
            started_mono=self.started_mono, started_wall=self.started_wall,
            started_all=self.started_all, epoch=self.epoch,
            prestop=self.lifecycle.prestop_view(), listeners=self.plane.listeners_info())
        info.update(self.plane.workers_info())
        return info

    # -- stats ------------------------------------------------------------------------------
    def _refresh_gauges(self) -> None:
        now = self.loop.time()
        ss = self.server_stats
        state = self.process.state
        ss.state = int(state)
        ss.live = 1 if state.name == "LIVE" else 0
        ss.uptime = int(now - self.started_mono)
        ss.total_connections = self.plane.connections()
        self.drain_stats.active = 1 if self.process.drain_active(now) else 0
        self.plane.sync_drain_counts()
        self.lm_stats.total_listeners_active = self.plane.accepting_listeners()
        self.lm_stats.total_listeners_draining = self.parent_draining + sum(
            1 for ls in self.listeners if ls.drain.draining)
