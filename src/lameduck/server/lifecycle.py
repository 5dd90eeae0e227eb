"""The lifecycle of a process that decides its own drain: the drain steps, the shutdown check,
the cut, the exit, the preStop FSM, health-check fail/ok and the drain report.

Written once, over a *data plane* (``DataPlane``): what serves the traffic, here in this
process (``server.local.LocalPlane``) or in worker processes (``server.pool.WorkerPool``). The
decisions are the drain core's (``ProcessDrain``); this carries them out on the loop's
monotonic clock, and the data plane carries them out on the connections.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from lameduck.config import Config, format_duration
from lameduck.drain import Cause, DrainEvent, LeaveStep, ListenerDrain, ProcessDrain, Step
from lameduck.drain.prestop import Leave, Prestop, PrestopAction, PrestopState, PrestopStrategy
from lameduck.drain.probers import Evidence, ProbeTracker, combine
from lameduck.drain.timeline import KEEP_REPORTS, Reading, Timeline, build_report, file_name
from lameduck.listeners import Listener
from lameduck.proxy.accesslog import flush_access_logs
from lameduck.restart import Notifier
from lameduck.restart.hot import HasFileno
from lameduck.server.views import drain_report_view, prestop_view
from lameduck.stats import DrainStats, ServerStats, Stat

log = logging.getLogger("lameduck")

EXIT_OK = 0
EXIT_CUT = 3  # the drain had to cut requests at the deadline
EXIT_FLUSH = 0.25  # seconds the last writes get to leave before the process exits


class DataPlane(Protocol):
    """What the lifecycle (and the process around it) needs from whatever serves the
    traffic. The counts are the process's as a whole: summed over workers, if any."""

    # words for the end's log lines: where the requests are ("" or " in the workers")
    cut_where: str
    idle_where: str

    # -- start: the process binds or inherits each listener's socket, then serves ----------
    def bind(self, listener: Listener) -> socket.socket:
        """A new listening socket for ``listener`` (ListenError when the address is taken)."""
        ...

    async def serve(self, listener: Listener, sock: socket.socket) -> None:
        """``listener`` serves on ``sock`` (accepts here, or in the workers)."""
        ...

    async def serving(self) -> None:
        """Every listener has its socket: whatever else must run before ready, runs."""
        ...

    def handover_sockets(self) -> list[tuple[str, str, HasFileno]]:
        """[(name, configured address, listening socket)] for a hot-restart successor."""
        ...

    def handover_quic(self) -> list[tuple[str, str, HasFileno, dict[int, HasFileno]]]:
        """[(name, configured address, UDP socket, {route: forwarding socket})] for a
        hot-restart successor (restart.hot.Source.handover_quic; listeners.quic.route)."""
        ...

    def quic_handed_over(self, names: list[str]) -> None:
        """The successor reads these listeners' UDP sockets from now on."""
        ...

    # -- what the decisions read -----------------------------------------------------------
    def connections(self) -> int:
        """Downstream connections open."""
        ...

    def queued(self) -> int:
        """Connections in the accept queues of the listeners still accepting: a client there
        counts as a connection (an exit would reset it)."""
        ...

    def unread(self) -> int:
        """Connections whose client has sent what this process has not read as a request yet
        and cannot turn away: a TLS handshake under way, a request head partly read (counted
        in ``connections`` too). An exit waits for them, the deadline cuts them."""
        ...

    def unheard(self) -> tuple[int, float]:
        """What an exit waits for besides requests, in one look: ``unread``, and the latest
        accept of a connection that has sent nothing yet (0: none;
        ``ProcessDrain.arriving_until``)."""
        ...

    def in_flight(self) -> int:
        """Requests in flight as the preStop FSM counts them (drain.sh's test)."""
        ...

    def draining_listeners(self) -> int:
        """Listeners with connections still open."""
        ...

    def accepting_listeners(self) -> int:
        ...

    def current(self) -> bool:
        """The counts include every drain message sent so far (False: decide a moment
        later, on fresher ones)."""
        ...

    def poll(self) -> bool:
        """Before an exit ahead of T: ask for fresh counts once (True: asked, decide again
        when they come); False: the counts are fresh already."""
        ...

    def sync_drain_counts(self) -> DrainStats:
        """``server.drain.*`` as of now (and the ledger's totals with them)."""
        ...

    def reading(self) -> Reading:
        """What the drain report's timeline samples."""
        ...

    # -- carrying the decisions out --------------------------------------------------------
    def drain_listeners(self, event: DrainEvent, reached: list[ListenerDrain], graceful: bool,
                        skip_exit: bool, inbound_only: bool) -> None:
        """``/drain_listeners``: ``event`` reached the connections of ``reached``."""
        ...

    def shutdown(self, event: DrainEvent, reached: list[ListenerDrain], notify: bool) -> None:
        """The shutdown drain began. ``notify``: the connections get ``event`` (False: they
        have had it since a drain_listeners that became the shutdown)."""
        ...

    def hand_over(self) -> None:
        """A hot restart's successor accepts on the same sockets from now: stop accepting
        here, and reset nothing (what is queued is the successor's)."""
        ...

    def healthcheck(self, failed: bool) -> None:
        ...

    def no_new_work(self) -> None:
        """T of the shutdown has passed: no new request on any connection."""
        ...

    def finish(self, step: Step, quit_why: str | None, limit: float) -> Awaitable[None]:
        """The end: stop accepting, cut what is in flight (``Step.CUT``), close what is idle;
        done once the last writes have left (by ``limit`` on the loop's clock)."""
        ...

    # -- admin ------------------------------------------------------------------------------
    def refresh(self) -> Awaitable[None] | None:
        ...

    def stats_snapshot(self) -> list[Stat]:
        ...

    def counters(self) -> dict[str, int]:
        ...

    def reset_counters(self) -> None:
        ...

    def set_log_level(self, name: str | None, level: str) -> None:
        ...

    def reopen_logs(self) -> None:
        ...

    def clusters_view(self) -> list[dict[str, Any]]:
        ...

    def listeners_info(self) -> list[dict[str, Any]]:
        """``/server_info``'s listeners: address, accepting, draining, connections."""
        ...

    def probe_trackers(self) -> list[tuple[str, ProbeTracker]]:
        """Each listener with a health-check path: (name, what its path saw, in every
        worker process if there are any)."""
        ...

    def watch_traffic(self, on: bool) -> None:
        """Record each non-probe request per source address (``leave: confirm`` watches)."""
        ...

    def workers_info(self) -> dict[str, Any]:
        """What ``/server_info`` adds about worker processes ({} without any)."""
        ...

    def housekeep(self) -> None:
        """Once a second."""
        ...


def flush_limit(step: Step, now: float, deadline: float | None, quitting: bool) -> float:
    """How long the last writes may take: a clean exit lets them reach slow readers up to the
    deadline; after a cut (the deadline itself) or a quit, only a short flush."""
    limit = now + EXIT_FLUSH
    if step is Step.EXIT and deadline is not None and not quitting:
        limit = max(limit, deadline)
    return limit


class Lifecycle:
    """The drain steps and the exit of one process, over ``plane``. ``on_exit`` closes what
    the process runs besides (admin, hot-restart socket, ...) just before ``done``."""

    def __init__(self, cfg: Config, loop: asyncio.AbstractEventLoop, process: ProcessDrain,
                 plane: DataPlane, server_stats: ServerStats, drain_stats: DrainStats,
                 notifier: Notifier, on_exit: Callable[[], None], started_mono: float,
                 started_wall: float) -> None:
        self.cfg = cfg
        self.loop = loop
        self.process = process
        self.plane = plane
        self.server_stats = server_stats
        self.drain_stats = drain_stats
        self.notifier = notifier
        self.on_exit = on_exit
        self.started_mono = started_mono
        self.started_wall = started_wall
        self.done: asyncio.Future[int] = loop.create_future()
        self._check_pending = False
        self._shutdown_timer: asyncio.TimerHandle | None = None
        self._polled = False  # asked for fresh counts before an exit ahead of T
        self.prestop: Prestop | None = None
        self._prestop_timer: asyncio.TimerHandle | None = None
        self._leave_timer: asyncio.TimerHandle | None = None  # shutdown.leave: confirm
        self.quitting = False
        self.quit_why = ""
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

    # -- what starts a drain ----------------------------------------------------------------
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
        self.plane.drain_listeners(event, reached, graceful, skip_exit, inbound_only)
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
        self.plane.healthcheck(True)

    def healthcheck_ok(self) -> None:
        if self.process.hc_failed:
            log.info("health check ok by admin")
        self.process.healthcheck_ok()
        self.plane.healthcheck(False)

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
        self.plane.shutdown(event, reached, notify=start is None)
        self._record_start(event)
        if self.process.leave_watching:  # shutdown.leave: confirm
            self._watch(now)
            self._leave_tick()
        self._schedule_shutdown_check(now)
        self.changed()

    def quit(self, why: str = "POST /quitquitquit") -> None:
        """Admin ``/quitquitquit`` (Envoy's: exit at once) and a second SIGINT: exit now,
        cutting what is in flight."""
        if self.quitting:
            return
        self.quitting = True
        self.quit_why = why
        log.info("%s: quit requested: exiting at once, without a drain", why)
        busy = not self.process.ledger.idle or self.plane.unread()
        self.loop.call_soon(self._finish, Step.CUT if busy else Step.EXIT)

    def _log_event(self, event: DrainEvent, detail: str) -> None:
        log.info("drain started (%s): strategy=%s T=%s G=%s %s", event.cause.value,
                 event.strategy.value, format_duration(event.time),
                 format_duration(event.grace), detail)

    # -- the shutdown check -----------------------------------------------------------------
    def changed(self) -> None:
        """A connection closed, a request ended or a worker reported: maybe the drain is over
        (coalesced)."""
        if self.process.shutdown is None or self._check_pending or self.quitting:
            return
        self._check_pending = True
        self.loop.call_soon(self._shutdown_check)

    def _schedule_shutdown_check(self, now: float) -> None:
        nxt = self.process.next_deadline(now, self.plane.unheard()[1])
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
            self._shutdown_timer = None
        if nxt is not None:
            self._shutdown_timer = self.loop.call_at(nxt, self._shutdown_check)

    def _shutdown_check(self) -> None:
        """Decided on counts that include every drain message sent (a request a worker took
        just before is in them); the deadline waits for nothing."""
        self._check_pending = False
        if self.quitting or self.done.done():
            return
        now = self.loop.time()
        deadline = self.process.deadline
        if not self.plane.current() and (deadline is None or now < deadline):
            self.loop.call_later(0.05, self.changed)  # or at the next status
            return
        self._drain_time_reached(now)
        # A client waiting in an accept queue is a connection too: exiting resets it.
        plane = self.plane
        unread, silent_since = plane.unheard()
        self._step(self.process.shutdown_step(now, plane.connections() + plane.queued(),
                                              unread, silent_since), now)

    def _step(self, step: Step, now: float) -> None:
        """What the shutdown decision says to do now. An exit before T because no connection
        is open is decided again on fresh counts, once (a worker reports a new connection at
        its next tick, not at once)."""
        ev = self.process.shutdown
        if (step is Step.EXIT and not self._polled and not self.quitting and ev is not None
                and now < ev.ends_at and self.plane.poll()):
            self._polled = True
            # decided again on the answers; or, with nobody left to answer, at once
            self.loop.call_later(0.05, self.changed)
            return
        self._polled = False
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
        log.info("drain time reached: no new work; %d requests in flight, %d connections",
                 self.process.ledger.active, self.plane.connections())
        self.plane.no_new_work()

    # -- the end ----------------------------------------------------------------------------
    def _finish(self, step: Step) -> None:
        if self.done.done() or self._finishing:
            return
        self._finishing = True
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
        plane = self.plane
        if step is Step.CUT:
            unread = plane.unread()
            log.warning("%s: cutting %d requests still in flight%s%s",
                        self.quit_why if self.quitting else "deadline",
                        self.process.ledger.active,
                        f" and {unread} TLS handshakes or request heads under way"
                        if unread else "", plane.cut_where)
        elif self.quitting:
            log.info("%s: no request in flight", self.quit_why)
        else:
            log.info("drain complete: no request in flight%s", plane.idle_where)
        limit = flush_limit(step, self.loop.time(), self.process.deadline, self.quitting)
        closed = plane.finish(step, self.quit_why if self.quitting else None, limit)
        self.loop.create_task(self._exit_when(closed))

    async def _exit_when(self, closed: Awaitable[None]) -> None:
        await closed
        self._close_down()

    def _close_down(self) -> None:
        """The end: the drain report, then everything this process runs, then ``done``."""
        ds = self.plane.sync_drain_counts()
        self.drain_report_line()
        self._record_end()
        for timer in (self._prestop_timer, self._drain_exit_timer, self._leave_timer):
            if timer is not None:
                timer.cancel()
        self.on_exit()
        if not self.done.done():
            self.done.set_result(EXIT_CUT if ds.cut else EXIT_OK)

    def drain_report_line(self) -> None:
        ds = self.plane.sync_drain_counts()
        log.info(
            "drain report: requests completed=%d refused=%d cut=%d (503=%d reset=%d); "
            "connections drained by response=%d proactively=%d at end=%d; "
            "reset in the accept queue at listener close=%d",
            ds.completed, ds.refused, ds.cut, ds.cut_before_response, ds.cut_reset,
            ds.cx_drained_by_response, ds.cx_drained_proactive, ds.cx_closed_at_end,
            ds.cx_reset_listener_close)

    # -- preStop ----------------------------------------------------------------------------
    def start_prestop(self, strategy: str, drain_timeout: float,
                      lb_buffer: float, leave: str = "timer") -> dict[str, Any]:
        """Admin ``POST /prestop``: run the preStop FSM in this process (once; a second call
        reports the one running)."""
        if self.prestop is None:
            self.prestop = Prestop(PrestopStrategy(strategy), drain_timeout, lb_buffer,
                                   leave=Leave(leave))
            log.info("prestop: strategy=%s drain_timeout=%s lb_buffer=%s leave=%s", strategy,
                     format_duration(drain_timeout), format_duration(lb_buffer), leave)
            self._prestop_do(self.prestop.start(self.loop.time()))
            self._prestop_tick()
        return self.prestop_view()

    def _prestop_do(self, actions: list[PrestopAction]) -> None:
        p = self.prestop
        assert p is not None
        for action in actions:
            if action is PrestopAction.DRAIN_LISTENERS:
                self.drain_listeners(True, True, False)
            else:
                self.healthcheck_fail()
                if p.leave is Leave.CONFIRM:
                    self._watch(self.loop.time())
        self.server_stats.prestop_state = int(p.state)

    # -- leave: confirm ---------------------------------------------------------------------
    def _watch(self, now: float) -> None:
        """The health check fails from ``now``: the counts in words start here, and every
        request is recorded per source address until the balancer is seen to let go."""
        self.plane.watch_traffic(True)
        for _, tracker in self.plane.probe_trackers():
            tracker.mark(now)

    def lb_evidence(self, now: float) -> Evidence:
        """Has the balancer let go? (``drain/probers.py``), over every listener with a
        health-check path; a prober that stopped probing is logged once."""
        named = self.plane.probe_trackers()
        for name, tracker in named:
            for p in tracker.newly_gone(now):
                log.info("leave: listener %s: prober %s gone (silent %.3fs): no longer "
                         "awaited", name, p.addr, now - p.last)
        return combine(now, [t for _, t in named])

    def _leave_tick(self) -> None:
        """SIGTERM with ``shutdown.leave: confirm``: the core decides on the evidence
        (``ProcessDrain.leave_step``); this acts on it."""
        self._leave_timer = None
        process = self.process
        if not process.leave_watching or self.done.done():
            return
        now = self.loop.time()
        lb = self.lb_evidence(now)
        step = process.leave_step(now, lb)
        if step is LeaveStep.WAIT:
            self._leave_timer = self.loop.call_at(process.leave_next(now), self._leave_tick)
            return
        if step is LeaveStep.CONFIRMED:
            log.info("shutdown: lb converged (confirm) after %.3fs: %s",
                     process.confirmed_after, lb.detail)
            self.changed()
        elif step is LeaveStep.BOUND:
            log.info("shutdown: min_drain elapsed before the LB was seen to stop: %s",
                     lb.detail)
        self._watch_done()

    def _watch_done(self) -> None:
        """The traffic watch ends once neither the shutdown's leave nor a preStop needs it."""
        if not self.process.leave_watching and (self.prestop is None or self.prestop.done):
            self.plane.watch_traffic(False)

    def _prestop_tick(self) -> None:
        """On a timer: the FSM's own deadline, and a 100 ms look at what is in flight."""
        self._prestop_timer = None
        p = self.prestop
        if p is None or p.done:
            return
        seen = len(p.transitions)
        now = self.loop.time()
        confirm = p.leave is Leave.CONFIRM and p.state is PrestopState.CLOSING
        lb = self.lb_evidence(now) if confirm else None
        self._prestop_do(p.tick(now, self.plane.in_flight(), lb))
        for t in p.transitions[seen:]:
            if p.leave is Leave.CONFIRM and t.source is PrestopState.CLOSING:
                log.info("prestop: %s", t.reason)  # lb converged, or what was still arriving
                self._watch_done()
            else:
                log.info("prestop: %s -> %s (%s)", t.source.name, t.target.name, t.reason)
        if p.done:
            # The load balancer has let go: a SIGTERM now may exit as soon as it is idle (and
            # its own watch, if it started one, has nothing left to prove).
            self.process.prestop_done()
            self._watch_done()
            if self.process.shutdown is not None:
                self.changed()
            return
        at = p.next_deadline()
        at = now + 0.1 if at is None else min(at, now + 0.1)
        self._prestop_timer = self.loop.call_at(at, self._prestop_tick)

    def prestop_view(self) -> dict[str, Any]:
        return prestop_view(self.prestop, self.loop.time(), self.plane.in_flight())

    # -- the drain report -------------------------------------------------------------------
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
        self.timeline = Timeline(event.start, self.plane.reading())
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
        if self.process.shutdown is None:
            self.process.tick(now)  # over once no longer active: its completions stop counting
            if self._drain_exit_timer is None and not self.process.drain_active(now):
                self._record_end()
                return
        tl.sample(now, self.plane.reading())
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
        tl.finish(self.loop.time(), self.plane.reading())
        ds = self.drain_stats
        shutdown = self.process.shutdown is ev
        report = build_report(
            tl, started_wall=self._recording_wall, pid=os.getpid(), cause=ev.cause.value,
            strategy=ev.strategy.value, time=ev.time, grace=ev.grace,
            deadline=self.process.exit_after if shutdown else None,
            min_drain=self.process.min_drain if shutdown else None, shutdown=shutdown,
            idle_close=self.process.settings.idle_close.value,
            counts={"completed": ds.completed, "refused": ds.refused, "cut": ds.cut,
                    "cut_before_response": ds.cut_before_response, "cut_reset": ds.cut_reset,
                    "cx_drained_by_response": ds.cx_drained_by_response,
                    "cx_drained_proactive": ds.cx_drained_proactive,
                    "cx_closed_at_end": ds.cx_closed_at_end,
                    "cx_reset_listener_close": ds.cx_reset_listener_close})
        leave = self._leave_record()
        if leave is not None:
            report["leave"] = leave
        self.reports.append(report)
        where = self.cfg.drain.report_dir
        if where:
            _write_report(where, report)

    def _leave_record(self) -> dict[str, Any] | None:
        """For the drain report (``lameduck budget`` reads it): how long the confirmed path
        took against its bound, when a confirm ran (``confirmed_after`` None: the bound won or
        it is still waiting)."""
        p = self.prestop
        if p is not None and p.leave is Leave.CONFIRM:
            return {"by": "prestop", "bound": p.lb_buffer, "confirmed_after": (
                None if p.confirmed_after is None else round(p.confirmed_after, 3))}
        bound = self.process.leave_bound
        if bound is not None:
            after = self.process.confirmed_after
            return {"by": "shutdown", "bound": bound,
                    "confirmed_after": None if after is None else round(after, 3)}
        return None

    def drain_reports(self, last: int | None) -> dict[str, Any]:
        return drain_report_view(self.reports, last)


def _write_report(where: str, report: dict[str, Any]) -> None:
    """Written whole then renamed, so a reader never sees half a report; a failure is logged,
    never fatal: the drain itself went as it went."""
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


def run_loop(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """A process's event loop, for the main process and each worker alike: uvloop when
    present (it is most of the speed of the I/O shell)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


def exit_now(code: int) -> None:
    """The end of a server process (``run``, ``supervise``, a worker) once its exit code is
    known: what is buffered is written (access logs, log handlers, stdout, stderr; the drain
    report is already on disk), then the process ends without the interpreter's teardown.
    That teardown (freeing every module and object, joining the resolver's threads) took 0.2 to
    1 s after the last log line, while a supervisor waiting for the exit (systemd, the kubelet,
    a load balancer's health check) has nothing more to learn: os._exit, as Python's docs say
    for a process that must not run its cleanup twice (and as forking servers do)."""
    flush_access_logs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # a reader gone (EPIPE) or a stream closed: nothing left to keep
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
