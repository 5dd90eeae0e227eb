"""SIGHUP without a supervisor: start the next process, `lameduck run --hot-restart` with the
same command line, which takes this one's sockets (restart/hot.py) once ready; this one then
drains and exits. The new process outlives this one: it is not killed at exit, only waited
for while this one runs, so one that fails early is reaped and reported."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
from collections.abc import Callable

log = logging.getLogger("lameduck")


class Successor:
    """At most one new process at a time; ``on_exit(pid, code)`` when it exits while we run."""

    def __init__(self, argv: list[str], loop: asyncio.AbstractEventLoop,
                 on_exit: Callable[[int, int], None]) -> None:
        self.argv = argv
        self.loop = loop
        self.on_exit = on_exit
        self.proc: subprocess.Popen[bytes] | None = None
        self._pidfd = -1

    @property
    def running(self) -> bool:
        return self.proc is not None

    def start(self, env: dict[str, str]) -> int:
        """Start it (stdout and stderr shared with this process: one log); its pid. OSError
        when it cannot be started."""
        self.proc = subprocess.Popen(self.argv, env=env, stdin=subprocess.DEVNULL)
        try:
            self._pidfd = os.pidfd_open(self.proc.pid)
        except OSError:  # no pidfd (an old kernel): not reaped until this one exits
            return self.proc.pid
        self.loop.add_reader(self._pidfd, self._exited)
        return self.proc.pid

    def _exited(self) -> None:
        proc = self.proc
        self.close()
        if proc is not None and proc.poll() is not None:
            self.on_exit(proc.pid, proc.returncode)

    def close(self) -> None:
        """Stop watching (at exit; the new process goes on)."""
        if self._pidfd >= 0:
            self.loop.remove_reader(self._pidfd)
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = -1
        self.proc = None
