"""The process: sockets (bound, inherited from systemd or a hot restart), admin, signals, the
drain's steps and the exit.

It drives the drain core's ``ProcessDrain`` (pure decisions) with the loop's monotonic clock and
carries out what it decides: tell the listeners, stop accepting, cut, exit. What it runs is
built from the config by ``server.build`` (no sockets there); the admin API reaches it through
``AdminControl``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import random
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from lameduck.admin import AdminHandlers, start_admin
from lameduck.admin.control import NotFound
from lameduck.config import Config, ConfigError, format_duration, load_config
from lameduck.drain import (
    Cause,
    DrainEvent,
    ListenerDrain,
    Step,
)
from lameduck.drain.endpoint import AdminState
from lameduck.drain.prestop import Prestop, PrestopAction, PrestopStrategy
from lameduck.drain.timeline import KEEP_REPORTS, Reading, Timeline, build_report, file_name
from lameduck.listeners import Listener, TcpListener
from lameduck.restart import Notifier
from lameduck.restart.hot import HasFileno, Inherited, Rendezvous, follow_parent, take_over
from lameduck.server.build import build
from lameduck.server.logfile import logger_levels, reopen_log_files, set_log_level
from lameduck.server.successor import Successor
from lameduck.server.views import (
    clusters_view,
    config_dump,
    drain_report_view,
    fmt_addr,
    listener_addresses,
    prestop_view,
    server_info,
)
from lameduck.stats import (
    DrainStats,
    Stat,
)

log = logging.getLogger("lameduck")

EXIT_OK = 0
EXIT_CUT = 3  # the drain had to cut requests at the deadline
EXIT_FLUSH = 0.25  # seconds the last writes get to leave before the process exits

# What `lameduck run` does with each signal (README.md, "Signals"); any other keeps its
# default action.
SIGNALS = (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
           signal.SIGUSR2)


class Server:
    """One lameduck process: data plane and control in one event loop (one worker)."""

    # how the end of the drain is logged (a worker's main process says it for all of them)
    finish_level = logging.INFO

    def __init__(self, cfg: Config, loop: asyncio.AbstractEventLoop | None = None,
                 sockets: dict[str, socket.socket] | None = None,
                 notifier: Notifier | None = None, inherited: Inherited | None = None,
                 restart_path: str | None = None, config_path: str | None = None,
                 successor_argv: list[str] | None = None) -> None:
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
        self.started_mono = self.loop.time()
        self.started_wall = time.time()
        self.started_all = inherited.started if inherited is not None else self.started_wall
        self.server_stats.hot_restart_epoch = self.epoch
        if inherited is not None:
            self.registry.carried = dict(inherited.counters)  # stats do not reset
        self.admin: asyncio.AbstractServer | None = None
        self.done: asyncio.Future[int] = self.loop.create_future()
        self._check_pending = False
        self._shutdown_timer: asyncio.TimerHandle | None = None
        self._housekeeping: asyncio.TimerHandle | None = None
        self.prestop: Prestop | None = None
        self._prestop_timer: asyncio.TimerHandle | None = None
        self._sigint_count = 0
        self._quitting = False
        self._quit_why = ""
        self._drain_exit_timer: asyncio.TimerHandle | None = None
        self._finishing = False
        self._no_new_work_logged = False
        # The drain being recorded (its event, wall-clock start), sampled every 100 ms while
        # it runs; the last few finished reports, oldest first (GET /drain_report).
        self.timeline: Timeline | None = None
        self._recording: DrainEvent | None = None
        self._recording_wall = 0.0
        self._sample_timer: asyncio.TimerHandle | None = None
        self.reports: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=KEEP_REPORTS)

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
                    sock = self._bind(listener)
                sock.setblocking(False)
                socks.append(sock)
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
            await self._serve(listener, sock)
            log.info("listener %s on %s", listener.name, fmt_addr(listener.sockname))
            # Envoy's LDS words, against the process before this one (hot restart)
            old = before.get(listener.name)
            if old is None:
                self.lm_stats.listener_added += 1
            elif old != listener.cfg.model_dump(mode="json"):
                self.lm_stats.listener_modified += 1
        await self._serving()
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

    def _bind(self, listener: Listener) -> socket.socket:
        return listener.bind()

    async def _serve(self, listener: Listener, sock: socket.socket) -> None:
        """This process accepts on ``sock`` (a main process with workers holds it)."""
        await listener.start(sock)

    async def _serving(self) -> None:
        """Every listener has its socket (a main process starts its workers here)."""

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

    # -- hot restart: the side that hands over ------------------------------------------------
    def handover_sockets(self) -> tuple[list[tuple[str, str, HasFileno]],
                                        tuple[str, HasFileno] | None]:
        listeners = [(ls.name, str(ls.cfg.address), ls.server.sockets[0])
                     for ls in self.listeners if ls.server is not None]
        admin = (None if self.admin is None
                 else (str(self.cfg.admin.address), self.admin.sockets[0]))
        return listeners, admin  # type: ignore[return-value]

    def listener_definitions(self) -> dict[str, Any]:
        return {lc.name: lc.model_dump(mode="json") for lc in self.cfg.listeners}

    def draining_listeners(self) -> int:
        return sum(1 for ls in self.listeners if ls.connections)

    def counters(self) -> dict[str, int]:
        self._refresh_gauges()
        return self.registry.counters()

    def connections(self) -> int:
        """Downstream connections open, on every listener."""
        return sum(len(ls.connections) for ls in self.listeners)

    def _queued(self) -> int:
        """Connections in the accept queues of the listeners still accepting."""
        return sum(ls.queued() for ls in self.listeners)

    def hand_over(self) -> None:
        """The new process is ready: stop accepting (it accepts on the same sockets), hand
        it the admin port, and drain; exit by parent_shutdown_time."""
        for ls in self.listeners:
            ls.stop_accepting(handed_over=True)
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

    def _housekeep(self) -> None:
        now = self.loop.time()
        for cluster in self.clusters.values():
            cluster.expire_idle(now)
        self._housekeeping = self.loop.call_later(1.0, self._housekeep)

    # -- AdminControl -----------------------------------------------------------------------
    def drain_listeners(self, graceful: bool, skip_exit: bool, inbound_only: bool) -> None:
        """Envoy's admin: ``graceful`` without ``skip_exit`` exits at the end of the drain
        period; with ``skip_exit``, or not graceful (listeners stop at once), it stays up."""
        now = self.loop.time()
        event, reached = self.process.drain_listeners(now, graceful, skip_exit, inbound_only)
        exits = graceful and not skip_exit
        if exits:
            self.notifier.stopping("drain_listeners")
        self._log_event(event, f"graceful={graceful} skip_exit={skip_exit} "
                               f"inboundonly={inbound_only} listeners={len(reached)}; "
                               + ("exits at the end of the drain" if exits else "stays up"))
        self._broadcast(event, reached)
        self._record_start(event)
        if exits and self._drain_exit_timer is None:
            self._drain_exit_timer = self.loop.call_at(event.ends_at, self._drain_end, event)

    def _drain_end(self, event: DrainEvent) -> None:
        """T of a drain_listeners without skip_exit: the drain becomes the shutdown (already
        at T: no new work, the requests in flight finish by the deadline, then exit)."""
        self._drain_exit_timer = None
        if self.process.shutdown is not None:
            return
        self.begin_shutdown("drain_listeners without skip_exit: drain time reached, exiting",
                            Cause.DRAIN_LISTENERS, start=event.start)

    def healthcheck_fail(self) -> None:
        if not self.process.hc_failed:
            log.info("health check failed by admin: every response now drains its connection")
        self.process.healthcheck_fail()

    def healthcheck_ok(self) -> None:
        if self.process.hc_failed:
            log.info("health check ok by admin")
        self.process.healthcheck_ok()

    def state_name(self) -> str:
        return self.process.state.name

    def start_prestop(self, strategy: str, drain_timeout: float,
                      lb_buffer: float) -> dict[str, Any]:
        """Admin ``POST /prestop``: run the preStop FSM in this process (once; a second call
        reports the one running)."""
        if self.prestop is None:
            self.prestop = Prestop(PrestopStrategy(strategy), drain_timeout, lb_buffer)
            log.info("prestop: strategy=%s drain_timeout=%s lb_buffer=%s", strategy,
                     format_duration(drain_timeout), format_duration(lb_buffer))
            self._prestop_do(self.prestop.start(self.loop.time()))
            self._prestop_tick()
        return self.prestop_view()

    def _in_flight(self) -> int:
        """A drain.sh completion test is downstream_rq_active + upstream_rq_active == 0; as a
        count, a proxied request is one, not two: the larger of the two sides (TCP
        connections being relayed count downstream: they have no requests)."""
        up = sum(c.stats.upstream_rq_active for c in self.clusters.values())
        down = 0
        for ls in self.listeners:
            st = ls.stats  # type: ignore[attr-defined]
            down += (st.downstream_cx_active if isinstance(ls, TcpListener)
                     else st.downstream_rq_active)
        return max(up, down)

    def _prestop_do(self, actions: list[PrestopAction]) -> None:
        p = self.prestop
        assert p is not None
        for action in actions:
            if action is PrestopAction.DRAIN_LISTENERS:
                self.drain_listeners(True, True, False)
            else:
                self.healthcheck_fail()
        self.server_stats.prestop_state = int(p.state)

    def _prestop_tick(self) -> None:
        """On a timer: the FSM's own deadline, and a 100 ms look at what is in flight."""
        self._prestop_timer = None
        p = self.prestop
        if p is None or p.done:
            return
        seen = len(p.transitions)
        now = self.loop.time()
        self._prestop_do(p.tick(now, self._in_flight()))
        for t in p.transitions[seen:]:
            log.info("prestop: %s -> %s (%s)", t.source.name, t.target.name, t.reason)
        if p.done:
            # The load balancer has let go: a SIGTERM now may exit as soon as it is idle.
            self.process.prestop_done()
            if self.process.shutdown is not None:
                self._changed()
            return
        at = p.next_deadline()
        at = now + 0.1 if at is None else min(at, now + 0.1)
        self._prestop_timer = self.loop.call_at(at, self._prestop_tick)

    def prestop_view(self) -> dict[str, Any]:
        return prestop_view(self.prestop, self.loop.time(), self._in_flight())

    def clusters_view(self) -> list[dict[str, Any]]:
        return clusters_view(self.clusters.values())

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
        return None  # one process: its numbers are its own

    def stats_snapshot(self) -> list[Stat]:
        self._refresh_gauges()
        return self.registry.snapshot()

    def used_stats(self) -> set[str]:
        return self.registry.used

    def reset_counters(self) -> None:
        self._refresh_gauges()
        self.registry.reset_counters()
        log.info("admin: counters reset to 0")

    def config_dump(self) -> dict[str, Any]:
        return config_dump(self.cfg, self.config_path, self.started_wall)

    def loggers(self) -> dict[str, str]:
        return logger_levels()

    def set_log_level(self, name: str | None, level: str) -> None:
        set_log_level(name, level)

    def server_info(self) -> dict[str, Any]:
        return server_info(
            self.process, self.cfg, self.config_path, now=self.loop.time(),
            started_mono=self.started_mono, started_wall=self.started_wall,
            started_all=self.started_all, epoch=self.epoch, prestop=self.prestop_view(),
            listeners=[
                {"name": ls.name, "address": fmt_addr(ls.sockname), "accepting": ls.accepting,
                 "draining": ls.drain.draining, "connections": len(ls.connections)}
                for ls in self.listeners
            ])

    def quit(self, why: str = "POST /quitquitquit") -> None:
        """Admin ``/quitquitquit`` (Envoy's: exit at once) and a second SIGINT: exit now,
        cutting what is in flight."""
        if self._quitting:
            return
        self._quitting = True
        self._quit_why = why
        log.info("%s: quit requested: exiting at once, without a drain", why)
        self.loop.call_soon(self._finish, Step.CUT if not self.process.ledger.idle else Step.EXIT)

    # -- shutdown ---------------------------------------------------------------------------
    def begin_shutdown(self, why: str = "SIGTERM", cause: Cause = Cause.SHUTDOWN,
                       deadline: float | None = None, start: float | None = None) -> None:
        """Not ready at once (Kubernetes readiness), then one drain event over every listener.
        ``start``: when the drain began, if earlier (a drain_listeners reaching its end)."""
        if self.process.shutdown is not None:
            return
        now = self.loop.time()
        event, reached = self.process.start_shutdown(now if start is None else start, cause,
                                                     deadline)
        if cause is not Cause.HOT_RESTART:
            self.notifier.stopping(why)
        s = self.cfg.shutdown
        self._log_event(event, f"{why}: not ready; "
                               f"deadline={format_duration(self.process.exit_after)} "
                               f"stop_accepting={s.stop_accepting.value}")
        if start is None:
            self._broadcast(event, reached)
        # else the connections have had this drain's notice since it started
        self._record_start(event)
        for ls in self.listeners:
            ls.schedule_stop()
        self._schedule_shutdown_check(now)
        self._changed()

    def _broadcast(self, event: DrainEvent, reached: list[ListenerDrain]) -> None:
        names = {ld.name for ld in reached}
        for ls in self.listeners:
            if ls.name in names:
                ls.broadcast(event)
            else:
                ls.schedule_stop()

    def _log_event(self, event: DrainEvent, detail: str) -> None:
        log.info("drain started (%s): strategy=%s T=%s G=%s %s", event.cause.value,
                 event.strategy.value, format_duration(event.time),
                 format_duration(event.grace), detail)

    def _schedule_shutdown_check(self, now: float) -> None:
        nxt = self.process.next_deadline(now)
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
            self._shutdown_timer = None
        if nxt is not None:
            self._shutdown_timer = self.loop.call_at(nxt, self._shutdown_check)

    def _changed(self) -> None:
        """A connection closed or a request ended: maybe the drain is over (coalesced)."""
        if self.process.shutdown is None or self._check_pending or self._quitting:
            return
        self._check_pending = True
        self.loop.call_soon(self._shutdown_check)

    def _shutdown_check(self) -> None:
        self._check_pending = False
        if self._quitting or self.done.done():
            return
        now = self.loop.time()
        self._drain_time_reached(now)
        # A client waiting in an accept queue is a connection too: exiting resets it.
        self._step(self.process.shutdown_step(now, self.connections() + self._queued()), now)

    def _step(self, step: Step, now: float) -> None:
        """What the shutdown decision says to do now."""
        if step is Step.WAIT:
            self._schedule_shutdown_check(now)
            return
        self._finish(step)

    def _drain_time_reached(self, now: float) -> None:
        """From T of a shutdown, once: no new work on any connection."""
        ev = self.process.shutdown
        assert ev is not None
        if now < ev.ends_at or self._no_new_work_logged:
            return
        self._no_new_work_logged = True
        log.log(self.finish_level,
                "drain time reached: no new work; %d requests in flight, %d connections",
                self.process.ledger.active, self.connections())
        for ls in self.listeners:
            ls.schedule_stop()  # a listener closing at T closes first: nobody new
            for conn in list(ls.connections):
                conn.no_new_work()

    def _finishing_now(self) -> bool:
        """True the first time the end begins (then never again)."""
        if self.done.done() or self._finishing:
            return False
        self._finishing = True
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
        return True

    def _finish(self, step: Step) -> None:
        if not self._finishing_now():
            return
        for ls in self.listeners:
            ls.stop_accepting()
        if step is Step.CUT:
            if self._quitting:
                log.warning("%s: cutting %d requests still in flight", self._quit_why,
                            self.process.ledger.active)
            else:
                log.warning("deadline: cutting %d requests still in flight",
                            self.process.ledger.active)
            for ls in self.listeners:
                for conn in list(ls.connections):
                    conn.cut()
        elif self._quitting:
            log.log(self.finish_level, "%s: no request in flight", self._quit_why)
        else:
            log.log(self.finish_level, "drain complete: no request in flight")
        for ls in self.listeners:
            for conn in list(ls.connections):
                conn.close_at_end()
        # A clean exit lets the last responses reach slow readers, up to the deadline; after a
        # cut (the deadline itself) or a quit, only a short flush.
        limit = self.loop.time() + EXIT_FLUSH
        deadline = self.process.deadline
        if step is Step.EXIT and deadline is not None and not self._quitting:
            limit = max(limit, deadline)
        self.loop.create_task(self._exit_after_flush(limit))

    def _unsent(self) -> bool:
        """Response bytes still waiting in a connection's write buffer."""
        for ls in self.listeners:
            for conn in ls.connections:
                t = conn.transport
                if t is not None and not conn.gone and t.get_write_buffer_size():
                    return True
        return False

    async def _exit_after_flush(self, limit: float) -> None:
        short = self.loop.time() + EXIT_FLUSH
        while self.connections() and self.loop.time() < limit:
            if self.loop.time() >= short and not self._unsent():
                break  # what is left has been written; its clients may linger
            await asyncio.sleep(0.01)
        for ls in self.listeners:
            for conn in list(ls.connections):
                if conn.transport is not None:
                    conn.transport.abort()
        for cluster in self.clusters.values():
            cluster.close_idle()
        self._close_down()

    def _close_down(self) -> None:
        """The end: the drain report, then everything this process runs, then ``done``."""
        ds = self._sync_drain_counts()
        self.drain_report_line()
        self._record_end()
        if self.admin is not None:
            self.admin.close()
        if self.rendezvous is not None:
            self.rendezvous.close()  # a last status to a successor; the path is left to it
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        if self._prestop_timer is not None:
            self._prestop_timer.cancel()
        if self._drain_exit_timer is not None:
            self._drain_exit_timer.cancel()
        if self.successor is not None:
            self.successor.close()  # the new process goes on without us
        for checker in self.checkers:
            checker.stop()
        if not self.done.done():
            self.done.set_result(EXIT_CUT if ds.cut else EXIT_OK)

    def drain_report_line(self) -> None:
        ds = self._sync_drain_counts()
        log.info(
            "drain report: requests completed=%d refused=%d cut=%d (503=%d reset=%d); "
            "connections drained by response=%d proactively=%d at end=%d; "
            "reset in the accept queue at listener close=%d",
            ds.completed, ds.refused, ds.cut, ds.cut_before_response, ds.cut_reset,
            ds.cx_drained_by_response, ds.cx_drained_proactive, ds.cx_closed_at_end,
            ds.cx_reset_listener_close)

    def _sync_drain_counts(self) -> DrainStats:
        """``server.drain.completed/refused/cut`` are the ledger's own counts, not kept twice."""
        ds, ledger = self.drain_stats, self.process.ledger
        ds.completed, ds.refused, ds.cut = ledger.completed, ledger.refused, ledger.cut
        return ds

    # -- the drain report -------------------------------------------------------------------
    def _reading(self) -> Reading:
        """What the timeline samples: in flight now (summed over listeners) and the drain
        counters so far."""
        requests = connections = upgrades = 0
        for ls in self.listeners:
            st = ls.stats  # type: ignore[attr-defined]
            connections += st.downstream_cx_active
            if isinstance(ls, TcpListener):
                upgrades += st.downstream_cx_active  # a relayed TCP connection is a tunnel
            else:
                requests += st.downstream_rq_active
                upgrades += st.downstream_cx_upgrades_active
        ds = self._sync_drain_counts()
        return Reading(requests, connections, upgrades, ds.cx_drained_by_response,
                       ds.cx_drained_proactive, ds.cx_closed_at_end, ds.refused, ds.cut)

    def _record_start(self, event: DrainEvent) -> None:
        """A drain event began: record it. A drain_listeners reaching its end becomes the
        shutdown with the same start, one drain, one timeline; any other new event ends the
        one recorded (it is kept) and starts its own."""
        if self._recording is not None and self._recording.start == event.start:
            self._recording = event
            return
        if self.timeline is not None:
            self._record_end()
        now = self.loop.time()
        self.timeline = Timeline(event.start, self._reading())
        self._recording = event
        self._recording_wall = self.started_wall + (event.start - self.started_mono)
        self._sample_timer = self.loop.call_at(self.timeline.next_at(now), self._sample_tick)

    def _sample_tick(self) -> None:
        """Every 100 ms while a drain runs. A drain that does not exit ends when it is no
        longer active (T passed, nothing in flight); a shutdown ends at the exit."""
        self._sample_timer = None
        tl = self.timeline
        if tl is None:
            return
        now = self.loop.time()
        if (self.process.shutdown is None and self._drain_exit_timer is None
                and not self.process.drain_active(now)):
            self._record_end()
            return
        tl.sample(now, self._reading())
        self._sample_timer = self.loop.call_at(tl.next_at(now), self._sample_tick)

    def _record_end(self) -> None:
        """The drain recorded ended: its report is kept, and written to drain.report_dir."""
        tl, ev = self.timeline, self._recording
        if tl is None or ev is None:
            return
        if self._sample_timer is not None:
            self._sample_timer.cancel()
            self._sample_timer = None
        self.timeline = self._recording = None
        tl.finish(self.loop.time(), self._reading())
        ds = self.drain_stats
        shutdown = self.process.shutdown is ev
        report = build_report(
            tl, started_wall=self._recording_wall, pid=os.getpid(), cause=ev.cause.value,
            strategy=ev.strategy.value, time=ev.time, grace=ev.grace,
            deadline=self.process.exit_after if shutdown else None,
            min_drain=self.process.min_drain if shutdown else None, shutdown=shutdown,
            counts={"completed": ds.completed, "refused": ds.refused, "cut": ds.cut,
                    "cut_before_response": ds.cut_before_response, "cut_reset": ds.cut_reset,
                    "cx_drained_by_response": ds.cx_drained_by_response,
                    "cx_drained_proactive": ds.cx_drained_proactive,
                    "cx_closed_at_end": ds.cx_closed_at_end,
                    "cx_reset_listener_close": ds.cx_reset_listener_close})
        self.reports.append(report)
        where = self.cfg.drain.report_dir
        if where:
            self._write_report(where, report)

    def _write_report(self, where: str, report: dict[str, Any]) -> None:
        """Written whole then renamed, so a reader never sees half a report; a failure is
        logged, never fatal: the drain itself went as it went."""
        path = os.path.join(where, file_name(report["started_unix"], report["pid"]))
        try:
            os.makedirs(where, exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(report, f, allow_nan=False)
                f.write("\n")
            os.replace(path + ".tmp", path)
        except (OSError, ValueError) as e:
            log.error("drain report: cannot write %s: %s", path, e)
            return
        log.info("drain report written to %s", path)

    def drain_reports(self, last: int | None) -> dict[str, Any]:
        return drain_report_view(self.reports, last)

    # -- stats ------------------------------------------------------------------------------
    def _refresh_gauges(self) -> None:
        now = self.loop.time()
        ss = self.server_stats
        state = self.process.state
        ss.state = int(state)
        ss.live = 1 if state.name == "LIVE" else 0
        ss.uptime = int(now - self.started_mono)
        ss.total_connections = self.connections()
        self.drain_stats.active = 1 if self.process.drain_active(now) else 0
        self._sync_drain_counts()
        self.lm_stats.total_listeners_active = sum(1 for ls in self.listeners if ls.accepting)
        self.lm_stats.total_listeners_draining = self.parent_draining + sum(
            1 for ls in self.listeners if ls.drain.draining)

