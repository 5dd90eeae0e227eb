"""`lameduck supervise`: what a container or systemd starts; it runs `lameduck run` as a child.

A wrapper that does not forward signals never drains. So the supervisor forwards
SIGTERM/SIGINT to its children and exits with their code; SIGHUP validates the config and
hot-restarts into a fresh child (restart/hot.py does the handover; the old child drains and
exits by itself); a child that dies on its own (SIGKILL, a crash) is started again. Every
child is reaped. Readiness comes from the children the way systemd gets it — sd_notify on a
datagram socket the supervisor owns — and is passed on to systemd when the supervisor runs
under it (READY=1, RELOADING=1, STOPPING=1).
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

from lameduck.config import ConfigError, load_config
from lameduck.restart.systemd import Notifier

log = logging.getLogger("lameduck.supervise")

READY_TIMEOUT = 60.0  # a new child not ready by then is stopped; the old one keeps serving
RESTART_BACKOFF = (0.2, 5.0)  # seconds before restarting a child that died, doubling


class Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.ready = asyncio.get_running_loop().create_future()  # set by READY=1
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid


class Supervisor:
    def __init__(self, config: str, log_level: str = "info",
                 admin_address_path: str | None = None) -> None:
        self.config = config
        self.log_level = log_level
        # each child writes its admin address there once it serves (a restarted child that
        # bound an ephemeral admin port anew rewrites it)
        self.admin_address_path = admin_address_path
        self.loop = asyncio.get_running_loop()
        self.systemd = Notifier()  # our own supervisor, if any (unsets NOTIFY_SOCKET)
        self.children: dict[int, Child] = {}
        self.current: Child | None = None  # the one that serves (or is about to)
        self.stopping = False
        self.stop_signal = signal.SIGTERM
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
    async def spawn(self) -> Child:
        env = dict(os.environ, NOTIFY_SOCKET=self.notify_path)
        # Its own session: a terminal's Ctrl-C or hangup reaches only the supervisor, which
        # forwards one signal (a second SIGINT would make the child quit without draining).
        extra = ([] if self.admin_address_path is None
                 else ["--admin-address-path", self.admin_address_path])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lameduck", "--log-level", self.log_level,
            "run", "-c", self.config, "--hot-restart", *extra, env=env,
            start_new_session=True)
        child = Child(proc)
        self.children[proc.pid] = child
        log.info("child %d started", proc.pid)
        self.loop.create_task(self._reap(child))
        if self.stopping:  # a SIGTERM came while it was being started: it drains too
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(self.stop_signal)
        return child

    async def _reap(self, child: Child) -> None:
        code = await child.proc.wait()
        self.children.pop(child.pid, None)
        if not child.ready.done():
            child.ready.set_exception(RuntimeError(f"exited with {code} before it was ready"))
            child.ready.exception()  # retrieved: a failed reload is logged where awaited
        log.info("child %d exited with %d", child.pid, code)
        if child is self.current:
            self.current = None
            self.exit_code = code if code >= 0 else 128 - code  # killed by signal N: 128+N
            if not self.stopping:
                # died on its own: start another (a hot restart finds no one; it binds anew)
                log.warning("child %d died; restarting in %.1fs", child.pid, self.backoff)
                await asyncio.sleep(self.backoff)
                self.backoff = min(self.backoff * 2, RESTART_BACKOFF[1])
                if not self.stopping and self.current is None:
                    self.current = await self.spawn()
                    self.loop.create_task(self._await_ready(self.current))
        if self.stopping and not self.children:
            self._finish()

    async def _await_ready(self, child: Child) -> bool:
        try:
            await asyncio.wait_for(asyncio.shield(child.ready), READY_TIMEOUT)
        except (RuntimeError, TimeoutError) as e:
            log.error("child %d did not become ready: %s", child.pid, e)
            return False
        self.backoff = RESTART_BACKOFF[0]
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
                log.info("child %d is ready", pid)

    # -- signals -------------------------------------------------------------------------------
    def reload(self) -> None:
        if self.stopping:
            return
        if self.reloading:
            self.reload_again = True
            log.info("SIGHUP during a reload: another one follows it")
            return
        self.reloading = True  # set now: two SIGHUPs in one loop turn make one reload
        self.loop.create_task(self._reload())

    async def _reload(self) -> None:
        """SIGHUP: check the config, then a new child hot-restarts from the current one."""
        try:
            load_config(self.config)
        except ConfigError as e:
            log.error("SIGHUP: config not valid, nothing changed:\n%s", e)
            self._reload_done()
            return
        self.systemd.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            new = await self.spawn()
            if await self._await_ready(new) and not self.stopping:
                old, self.current = self.current, new
                log.info("SIGHUP: child %d serves; child %s drains",
                         new.pid, old.pid if old else "-")
            elif new.pid in self.children and not new.ready.done():
                # never ready: the old child never stopped accepting and stays current;
                # SIGTERM, not SIGKILL, in case it told the old one to drain after all
                with contextlib.suppress(ProcessLookupError):
                    new.proc.terminate()
            elif self.stopping and new.ready.done():
                self.current = new  # both drain (stop reached it); its exit code counts
        finally:
            if not self.stopping:
                self.systemd.send("READY=1", "STATUS=serving")
            self._reload_done()

    def _reload_done(self) -> None:
        self.reloading = False
        if self.reload_again and not self.stopping:
            self.reload_again = False
            self.reload()

    def stop(self, sig: int) -> None:
        """SIGTERM/SIGINT: forwarded to every child (each drains); exit when they are gone."""
        if not self.stopping:
            self.stopping = True
            self.stop_signal = signal.Signals(sig)
            self.systemd.send("STOPPING=1")
            log.info("%s: forwarding to %d children", signal.Signals(sig).name,
                     len(self.children))
        for child in list(self.children.values()):
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(sig)
        if not self.children:
            self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(self.exit_code)

    def close(self) -> None:
        self.loop.remove_reader(self.notify.fileno())
        self.notify.close()
        with contextlib.suppress(OSError):
            os.unlink(self.notify_path)
            os.rmdir(self.dir)


async def supervise(config: str, log_level: str = "info",
                    admin_address_path: str | None = None) -> int:
    sup = Supervisor(config, log_level, admin_address_path)
    loop = sup.loop
    try:
        loop.add_signal_handler(signal.SIGHUP, sup.reload)
        loop.add_signal_handler(signal.SIGTERM, sup.stop, signal.SIGTERM)
        loop.add_signal_handler(signal.SIGINT, sup.stop, signal.SIGINT)
        sup.current = await sup.spawn()
        if await sup._await_ready(sup.current):
            sup.systemd.send("READY=1", f"MAINPID={os.getpid()}", "STATUS=serving")
        else:
            # a first child that cannot start (an address in use...): report it, no loop
            sup.stop(signal.SIGTERM)
            return (await sup.done) or 1
        return await sup.done
    finally:
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        sup.close()
