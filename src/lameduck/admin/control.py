"""What the admin API needs from the server: an interface, so admin/ never imports server/."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from lameduck.stats import Stat


class NotFound(Exception):
    """What the admin API was asked about does not exist (answered 404 with the message)."""


class AdminControl(Protocol):
    def drain_listeners(self, graceful: bool, skip_exit: bool, inbound_only: bool) -> None: ...
    def healthcheck_fail(self) -> None: ...
    def healthcheck_ok(self) -> None: ...
    def state_name(self) -> str: ...
    def server_info(self) -> dict[str, Any]: ...
    def stats_snapshot(self) -> list[Stat]: ...
    def refresh(self) -> Awaitable[None] | None:
        """What to await before answering with the process's numbers (a main process asks
        its workers); None: they are here already."""
    def used_stats(self) -> set[str]:
        """Names of the stats seen non-zero so far (Envoy's usedonly)."""
    def reset_counters(self) -> None:
        """Every counter to 0 from now on; gauges untouched."""
    def config_dump(self) -> dict[str, Any]:
        """The effective config (defaults filled in) under ``bootstrap``, as JSON values."""
    def loggers(self) -> dict[str, str]:
        """Every lameduck logger's name and effective level (``debug``, ``info``, ...)."""
    def set_log_level(self, name: str | None, level: str) -> None:
        """One logger's level, or every lameduck logger's with ``name`` None."""
    def quit(self) -> None: ...
    def clusters_view(self) -> list[dict[str, Any]]: ...
    def listener_addresses(self) -> list[tuple[str, str, int]]:
        """(name, host, port) of every listener, as bound (an ephemeral port resolved)."""
    def start_prestop(self, strategy: str, drain_timeout: float,
                      lb_buffer: float, leave: str = "timer") -> dict[str, Any]: ...
    def drain_reports(self, last: int | None) -> dict[str, Any]:
        """The finished drains' reports, newest first (``last``: only that many)."""
    def set_endpoint_state(self, cluster: str, address: str, state: str) -> None:
        """NotFound: no such cluster or endpoint; ValueError: no such state."""
