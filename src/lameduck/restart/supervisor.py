"""`lameduck supervise`: what a container or systemd starts; it runs `lameduck run` as a child.

The supervisor holds every listener's listening socket (restart/held.py) and passes them to
each child the way systemd's socket activation does, so a child that dies costs only the
requests it held: new connections wait in the kernel's accept queue for the replacement.

A wrapper that does not forward signals never drains. So the supervisor forwards the
operators' signals to its children and exits with their code: SIGTERM/SIGQUIT (drain and
exit), SIGINT (drain; a second one kills the children and exits at once), SIGUSR1 (reopen log
files), SIGUSR2 (logged and ignored); SIGHUP validates the config and hot-restarts into a
fresh child (restart/hot.py does the handover; the old child drains and exits by itself). A
child that dies on its own (SIGKILL, a crash) is started again. Every child is reaped.
Readiness comes from the children the way systemd gets it — sd_notify on a datagram socket
the supervisor owns — and is passed on to systemd when the supervisor runs under it
(READY=1, RELOADING=1, STOPPING=1).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Sequence

from lameduck.config import ConfigError, load_config
from lameduck.restart.held import Held, HeldSockets
from lameduck.restart.systemd import Notifier, pass_listen_fds

log = logging.getLogger("lameduck.supervise")

READY_TIMEOUT = 60.0  # a new child not ready by then is stopped; the old one keeps serving
RESTART_BACKOFF = (0.2, 5.0)  # seconds before restarting a child that died, doubling
EXIT_SECOND_SIGINT = 128 + signal.SIGINT  # the shell's code for "killed by SIGINT"
# Each child finds the supervisor's pid here: its start-up text then says to signal the
# supervisor, not the child (a child stopped alone is restarted; one hot-restarted alone leaves
# a successor the supervisor does not know).
SUPERVISOR_ENV = "LAMEDUCK_SUPERVISOR_PID"

# What a child runs: take the held sockets as systemd would pass them, then `lameduck ...` (the
# command line is the top of the import graph: restart/ does not import it).
CHILD_BOOT = ("import sys; from lameduck.restart.supervisor import child_argv; "
              "from lameduck.cli import main; sys.exit(main(child_argv()))")

# Signals forwarded to the children, and what they mean there (for the log).
FORWARDED = {
    signal.SIGTERM: "drain and exit",
    signal.SIGQUIT: "drain and exit",
    signal.SIGINT: "drain and exit; a second SIGINT kills it",
    signal.SIGUSR1: "reopen log files",
    signal.SIGUSR2: "logged and ignored",
}


def child_argv() -> list[str]:
    """A child's entry (``python -c CHILD_BOOT FD=NAME ... -- <lameduck arguments>``): the
    sockets are moved to fd 3 on with LISTEN_* set for this pid; then `lameduck` runs with the
    arguments returned, in the same process (its pid is the one the supervisor knows)."""
    argv = sys.argv[1:]
    sep = argv.index("--")
    fds = [(int(fd), name) for fd, _, name in (spec.partition("=") for spec in argv[:sep])]
    pass_listen_fds(fds)
    return argv[sep + 1:]


def handles(pid: int, sig: int) -> bool:
    """Whether process ``pid`` catches or ignores ``sig`` (/proc/PID/status SigCgt, SigIgn):
    forwarding a signal it does not handle would run the default action — for SIGUSR1,
    SIGUSR2 and SIGQUIT, kill it (signal(7))."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            masks = {k: int(v, 16) for k, _, v in (line.partition(":\t") for line in f)
                     if k in ("SigCgt", "SigIgn")}
    except (OSError, ValueError):
        return True  # no /proc: trust it
    bit = 1 << (sig - 1)
    return bool((masks.get("SigCgt", 0) | masks.get("SigIgn", 0)) & bit)


def describe_exit(code: int) -> str:
    """asyncio's returncode in words: -N is "killed by signal N"."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.ready = asyncio.get_running_loop().create_future()  # set by READY=1
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid


class Supervisor:
    def __init__(self, config: str, log_args: Sequence[str] = (),
                 admin_address_path: str | None = None) -> None:
        self.config = config
        self.log_args = list(log_args)  # the global log options, before `run`
        # each child writes its admin address there once it serves (a restarted child that
        # bound an ephemeral admin port anew rewrites it)
        self.admin_address_path = admin_address_path
        self.loop = asyncio.get_running_loop()
        self.systemd = Notifier()  # our own supervisor, if any (unsets NOTIFY_SOCKET)
        self.sockets = HeldSockets()
        self.children: dict[int, Child] = {}
        self.current: Child | None = None  # the one that serves (or is about to)
        self.served = False  # a child has been ready once: later deaths are restarted
        self.stopping = False
        self.stop_signal = signal.SIGTERM
        self.sigints = 0
        self.killing = False  # a second SIGINT: children SIGKILLed, exit once reaped
        self.reloading = False
        self.reload_again = False  # a SIGHUP came during a reload: one more after it
        self.backoff = RESTART_BACKOFF[0]
        self.exit_code = 0
        self.done: asyncio.Future[int] = self.loop.create_future()
        self.dir = tempfile.mkdtemp(prefix="lameduck-supervise-")
        self.notify_path = os.path.join(self.dir, "notify.sock")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.notify.bind(self.notify_path)
        self.notify.setblocking(False)
        self.loop.add_reader(self.notify.fileno(), self._notified)

    # -- children ------------------------------------------------------------------------------
    async def spawn(self, held: dict[str, Held] | None = None,
                    successor: bool = False) -> Child:
        """A child serving ``held`` (default: what is held now); ``successor``: it takes over
        from the current child (hot restart)."""
        held = self.sockets.held if held is None else held
        env = dict(os.environ, NOTIFY_SOCKET=self.notify_path)
        env[SUPERVISOR_ENV] = str(os.getpid())
        extra = ([] if self.admin_address_path is None
                 else ["--admin-address-path", self.admin_address_path])
        if successor:
            extra.append("--hot-restart")  # a run takes over only when told to
        specs = [f"{h.sock.fileno()}={name}" for name, h in held.items()]
        # Its own session: a terminal's Ctrl-C or hangup reaches only the supervisor, which
        # forwards one signal (a second SIGINT would make the child quit without draining).
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD_BOOT, *specs, "--", *self.log_args, "run",
            "-c", self.config, *extra, env=env, start_new_session=True,
            pass_fds=[h.sock.fileno() for h in held.values()])
        child = Child(proc)
        self.children[proc.pid] = child
        log.info("child %d started (listeners: %s)", proc.pid,
                 ", ".join(f"{name} on {h.where()}" for name, h in held.items()) or "none")
        self.loop.create_task(self._reap(child))
        if self.stopping:  # a stop came while it was being started: it drains too
            self._send(child, self.stop_signal)
        return child

    async def _reap(self, child: Child) -> None:
        code = await child.proc.wait()
        self.children.pop(child.pid, None)
        if not child.ready.done():
            child.ready.set_exception(RuntimeError(f"it {describe_exit(code)} first"))
            child.ready.exception()  # retrieved: a failed reload is logged where awaited
        log.info("child %d %s", child.pid, describe_exit(code))
        if child is self.current:
            self.current = None
            self.exit_code = code if code >= 0 else 128 - code  # killed by signal N: 128+N
            if self.stopping:
                pass
            elif not self.served:
                log.error("child %d %s before it was ever ready: not restarting it",
                          child.pid, describe_exit(code))
            elif self.reloading:
                log.warning("child %d died during a reload: the new child takes over",
                            child.pid)
            else:
                self.loop.create_task(self._restart(f"child {child.pid} died"))
        if self.stopping and not self.children:
            self._finish()

    async def _restart(self, why: str) -> None:
        """No child serves (``why``): another takes the held sockets, after the backoff."""
        delay = self.backoff
        self.backoff = min(self.backoff * 2, RESTART_BACKOFF[1])  # reset once one is ready
        log.warning("%s; restarting in %.1fs (the listening sockets stay open: new "
                    "connections wait in the accept queue)", why, delay)
        await asyncio.sleep(delay)
        if self.stopping or self.current is not None or self.reloading:
            log.info("not restarting: %s", "stopping" if self.stopping else
                     "a reload started meanwhile" if self.reloading else "a child serves")
            return
        self.current = await self.spawn()
        self.loop.create_task(self._await_ready(self.current))

    async def _await_ready(self, child: Child) -> bool:
        try:
            await asyncio.wait_for(asyncio.shield(child.ready), READY_TIMEOUT)
        except (RuntimeError, TimeoutError) as e:
            log.error("child %d did not become ready: %s", child.pid, e or "timed out")
            return False
        return True

    def _notified(self) -> None:
        while True:
            try:
                data = self.notify.recv(4096)
            except BlockingIOError:
                return
            fields = dict(line.partition("=")[::2] for line in data.decode().splitlines())
            pid = int(fields.get("MAINPID", "0") or 0)
            child = self.children.get(pid)
            if child is not None and fields.get("READY") == "1" and not child.ready.done():
                child.ready.set_result(None)
                self.served = True
                self.backoff = RESTART_BACKOFF[0]
                log.info("child %d is ready", pid)

    # -- signals -------------------------------------------------------------------------------
    def reload(self) -> None:
        if self.stopping:
            log.info("SIGHUP: stopping already; not reloading")
            return
        if self.reloading:
            self.reload_again = True
            log.info("SIGHUP during a reload: another one follows it")
            return
        self.reloading = True  # set now: two SIGHUPs in one loop turn make one reload
        self.loop.create_task(self._reload())

    async def _reload(self) -> None:
        """SIGHUP: check the config, hold its sockets, then a new child hot-restarts from the
        current one."""
        try:
            cfg = load_config(self.config)
        except ConfigError as e:
            log.error("SIGHUP: config not valid, nothing changed:\n%s", e)
            self._reload_done()
            return
        try:
            planned = self.sockets.plan(cfg.listeners)
        except OSError as e:
            log.error("SIGHUP: %s; nothing changed", e.strerror or e)
            self._reload_done()
            return
        log.info("SIGHUP: config re-read; starting a new child to take over from child %s",
                 self.current.pid if self.current else "-")
        self.systemd.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        committed = False
        try:
            new = await self.spawn(planned, successor=True)
            if await self._await_ready(new) and not self.stopping:
                old, self.current = self.current, new
                self.sockets.commit(planned)
                committed = True
                log.info("SIGHUP: child %d serves; child %s drains",
                         new.pid, old.pid if old else "-")
            elif new.pid in self.children and not new.ready.done():
                # never ready: the old child never stopped accepting and stays current;
                # SIGTERM, not SIGKILL, in case it told the old one to drain after all
                log.warning("SIGHUP: child %d not ready; SIGTERM to it, child %s keeps "
                            "serving", new.pid, self.current.pid if self.current else "-")
                self._send(new, signal.SIGTERM)
            elif self.stopping and new.ready.done():
                self.current = new  # both drain (stop reached it); its exit code counts
        finally:
            if not committed:
                self.sockets.abort(planned)
            if not self.stopping:
                self.systemd.send("READY=1", "STATUS=serving")
            self._reload_done()

    def _reload_done(self) -> None:
        self.reloading = False
        if self.current is None and self.served and not self.stopping:
            # the serving child died during a reload that failed: start one as after a crash
            self.loop.create_task(self._restart("no child serves after the reload"))
        if self.reload_again and not self.stopping:
            self.reload_again = False
            self.reload()

    def _send(self, child: Child, sig: int, why: str = "") -> None:
        """Signal one child, saying so in the log."""
        sig = signal.Signals(sig)
        try:
            child.proc.send_signal(sig)
        except ProcessLookupError:
            log.info("%s: child %d has exited already", sig.name, child.pid)
            return
        log.info("%s sent to child %d%s", sig.name, child.pid, f" ({why})" if why else "")

    def forward(self, sig: int) -> None:
        """SIGUSR1/SIGUSR2: to every child that handles it (one that does not would die)."""
        sig = signal.Signals(sig)
        if not self.children:
            log.info("%s: no child runs; nothing forwarded", sig.name)
        for child in list(self.children.values()):
            if handles(child.pid, sig):
                self._send(child, sig, FORWARDED[sig])
            else:
                log.warning("%s not forwarded to child %d: it does not handle %s (its "
                            "default action would end it)", sig.name, child.pid, sig.name)

    def stop(self, sig: int) -> None:
        """SIGTERM/SIGQUIT/SIGINT: forwarded to every child (each drains); exit when they are
        gone. The held sockets are closed at once: each child has its own copy until it stops
        accepting, and no connection should queue where no one will accept it."""
        sig = signal.Signals(sig)
        if sig == signal.SIGINT:
            self.sigints += 1
            if self.sigints > 1:
                self._kill_all()
                return
        if not self.stopping:
            self.stopping = True
            self.stop_signal = sig
            self.systemd.send("STOPPING=1")
            self.sockets.close()
        if not self.children:
            log.info("%s: no child runs; exiting", sig.name)
            self._finish()
            return
        for child in list(self.children.values()):
            if sig == signal.SIGQUIT and not handles(child.pid, sig):
                self._send(child, signal.SIGTERM, "drain and exit: it does not handle SIGQUIT")
            else:
                self._send(child, sig, FORWARDED[sig])
        log.info("%s: exiting once %s has exited", sig.name,
                 ", ".join(f"child {pid}" for pid in self.children))

    def _kill_all(self) -> None:
        """A second SIGINT: the operator wants out now."""
        self.killing = True
        self.stopping = True
        self.exit_code = EXIT_SECOND_SIGINT
        log.warning("second SIGINT: killing %s and exiting",
                    ", ".join(f"child {pid}" for pid in self.children) or "no child")
        for child in list(self.children.values()):
            self._send(child, signal.SIGKILL, "second SIGINT")
        if not self.children:
            self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(EXIT_SECOND_SIGINT if self.killing else self.exit_code)

    def give_up(self) -> None:
        """The first child did not become ready: no restart loop; its failure is the exit."""
        self.stopping = True
        self.sockets.close()
        for child in list(self.children.values()):
            self._send(child, signal.SIGTERM, f"not ready within {READY_TIMEOUT:.0f}s")
        if not self.children:
            self._finish()

    def close(self) -> None:
        self.loop.remove_reader(self.notify.fileno())
        self.notify.close()
        self.sockets.close()
        with contextlib.suppress(OSError):
            os.unlink(self.notify_path)
            os.rmdir(self.dir)


SIGNALS = (signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT, signal.SIGINT, signal.SIGUSR1,
           signal.SIGUSR2)


async def supervise(config: str, log_args: Sequence[str] = (),
                    admin_address_path: str | None = None,
                    passed: dict[str, socket.socket] | None = None) -> int:
    """``passed``: listener name → a socket systemd passed (socket activation)."""
    sup = Supervisor(config, log_args, admin_address_path)
    loop = sup.loop
    try:
        try:
            sup.sockets.adopt(load_config(config).listeners, dict(passed or {}))
        except (OSError, ConfigError) as e:
            log.error("cannot listen: %s", e.strerror if isinstance(e, OSError) else e)
            return 1
        loop.add_signal_handler(signal.SIGHUP, sup.reload)
        for sig in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT):
            loop.add_signal_handler(sig, sup.stop, sig)
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            loop.add_signal_handler(sig, sup.forward, sig)
        sup.current = await sup.spawn()
        if await sup._await_ready(sup.current):
            sup.systemd.send("READY=1", f"MAINPID={os.getpid()}", "STATUS=serving")
        elif not sup.stopping:
            sup.give_up()
            return (await sup.done) or 1
        return await sup.done
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
        sup.close()
