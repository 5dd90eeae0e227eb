"""The process log: its line formats and ``--log-file``.

Every line starts with an ISO 8601 / RFC 3339 timestamp with the date, milliseconds and the
UTC offset (``2026-12-01T18:55:41.123+00:00``): a line from a log file kept for days, or from
hosts in other zones, says when it was written without guessing. ``--log-format json`` writes
one JSON object per line (``time``, ``level``, ``logger``, ``message``, ``pid``) for a log
shipper. ``--log-file``: the log in a file that SIGUSR1 reopens, for logrotate (its ``create``
mode renames the file, then signals; a process that kept writing would fill the renamed one).
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime
from typing import Final

from lameduck.proxy.accesslog import reopen_access_logs

# The pid on every line: a hot restart runs two processes into one log for a while, and a
# supervisor's children follow one another (the JSON lines carry it as ``pid``).
TEXT_FORMAT = "%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s"


def iso_time(created: float) -> str:
    """``record.created`` in local time with its offset, to the millisecond (RFC 3339)."""
    return datetime.fromtimestamp(created).astimezone().isoformat(timespec="milliseconds")


class IsoFormatter(logging.Formatter):
    """The text lines: Python logging's ``formatTime`` gives only a ``time.strftime`` format,
    which has no milliseconds in ``datefmt``, so the timestamp is made here."""

    def formatTime(self, record: logging.LogRecord,
                   datefmt: str | None = None) -> str:
        return iso_time(record.created)


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a traceback, if any, in ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {"time": iso_time(record.created), "level": record.levelname,
                                  "logger": record.name, "message": record.getMessage(),
                                  "pid": record.process}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False)


def json_logging() -> bool:
    """Whether the process log is JSON (``--log-format json``): what is said before it runs
    (a config refused) is said the same way."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def config_error_lines(source: str, problems: tuple[tuple[str, str], ...]) -> list[str]:
    """A refused config as JSON log records, one per problem: the fields of every record
    (``time``, ``level``, ``logger``, ``message``, ``pid``), with the problem's ``source``,
    ``field`` and ``problem`` apart for a log shipper."""
    now = iso_time(time.time())
    return [json.dumps({"time": now, "level": "ERROR", "logger": "lameduck.config",
                        "message": f"{source}: {path}: {message}" if path
                        else f"{source}: {message}",
                        "pid": os.getpid(), "source": source, "field": path,
                        "problem": message}, ensure_ascii=False)
            for path, message in problems]


# Libraries' loggers and the least level of theirs the process log shows: aioquic logs each
# QUIC connection's negotiation and close at INFO ("quic"), per connection, not what an
# operator reads; its warnings still show.
LIBRARY_LEVELS: Final = {"quic": logging.WARNING}


def formatter(kind: str) -> logging.Formatter:
    """``--log-format``: ``text`` or ``json``. Called where a process sets up its log (the
    main process, each worker): the libraries' levels are set with it."""
    for name, level in LIBRARY_LEVELS.items():
        logging.getLogger(name).setLevel(level)
    return JsonFormatter() if kind == "json" else IsoFormatter(TEXT_FORMAT)


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


def level_name(level: int) -> str:
    """Envoy's level words for Python's levels (above critical: off)."""
    return "off" if level > logging.CRITICAL else logging.getLevelName(level).lower()


def logger_levels() -> dict[str, str]:
    """Every lameduck logger's name and effective level (admin ``GET /logging``)."""
    names = ["lameduck", *(name for name, lg in logging.root.manager.loggerDict.items()
                           if name.startswith("lameduck.") and isinstance(lg, logging.Logger))]
    return {name: level_name(logging.getLogger(name).getEffectiveLevel()) for name in names}


def set_log_level(name: str | None, level: str) -> None:
    """One logger's level, or every lameduck logger's with ``name`` None (admin
    ``POST /logging``; a worker applies what its main process was asked)."""
    value = logging.CRITICAL + 1 if level == "off" else getattr(logging, level.upper())
    for each in [name] if name is not None else list(logger_levels()):
        logging.getLogger(each).setLevel(value)
    logging.getLogger("lameduck").info("admin: log level of %s set to %s",
                                       name or "every logger", level)
