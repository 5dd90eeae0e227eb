"""``--log-file``: the log in a file that SIGUSR1 reopens, for logrotate (its ``create`` mode
renames the file, then signals; a process that kept writing would fill the renamed one)."""

from __future__ import annotations

import logging

from lameduck.proxy.accesslog import reopen_access_logs


class ReopenableFile(logging.FileHandler):
    """A FileHandler whose file can be reopened at the same path, without losing a record."""

    def reopen(self) -> None:
        self.acquire()
        try:
            old, self.stream = self.stream, self._open()
            if old is not None:
                old.close()
        finally:
            self.release()


def open_log_file(path: str) -> ReopenableFile:
    """Opened now (append), so a path that cannot be written fails the start."""
    return ReopenableFile(path, mode="a", encoding="utf-8")


def reopen_log_files() -> list[str]:
    """Reopen every ``--log-file`` of the root logger and every access log file (logrotate
    renames both); the paths reopened."""
    done = reopen_access_logs()
    for h in logging.getLogger().handlers:
        if isinstance(h, ReopenableFile):
            h.reopen()
            done.append(h.baseFilename)
    return done
