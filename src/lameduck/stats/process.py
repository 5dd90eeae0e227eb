"""The Prometheus client libraries' standard ``process_*`` metrics, read at scrape time.

Every official client exports them (prometheus.io, "Writing client libraries: Standard and
runtime collectors"), so the usual dashboards and alerts work: memory, CPU, descriptors used
against the limit (lameduck's connection cap is derived from that limit), and the start time
(a restart shows as a step). Read from /proc/self, which systemd's ``ProcSubset=pid`` keeps;
where /proc is absent a metric is left out rather than reported as 0.
"""

from __future__ import annotations

import os
import resource
import time
from typing import NamedTuple

__all__ = ["ProcessMetric", "process_metrics"]


class ProcessMetric(NamedTuple):
    name: str
    kind: str  # Prometheus type: gauge or counter
    help: str
    value: float


_PAGE: int = os.sysconf("SC_PAGE_SIZE")
_TICKS: int = os.sysconf("SC_CLK_TCK")


def _statm() -> tuple[int, int] | None:
    """(virtual, resident) bytes, from /proc/self/statm (proc(5)); None without /proc."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            size, resident = f.read().split()[:2]
    except (OSError, ValueError):
        return None
    return int(size) * _PAGE, int(resident) * _PAGE


def _start_time() -> float | None:
    """Unix time the process started: /proc/self/stat's starttime (clock ticks after boot)
    against CLOCK_BOOTTIME now, so /proc/stat's btime (hidden by ProcSubset=pid) is not
    needed."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
        # the command name, field 2, is in parentheses and may hold spaces: count after it
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - (since_boot - start_ticks / _TICKS)


def _open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # listdir's own descriptor
    except OSError:
        return None


def process_metrics() -> list[ProcessMetric]:
    """This process's metrics, with the client libraries' names and HELP texts."""
    out: list[ProcessMetric] = []
    t = os.times()
    out.append(ProcessMetric("process_cpu_seconds_total", "counter",
                             "Total user and system CPU time spent in seconds.",
                             t.user + t.system))
    mem = _statm()
    if mem is not None:
        out.append(ProcessMetric("process_virtual_memory_bytes", "gauge",
                                 "Virtual memory size in bytes.", mem[0]))
        out.append(ProcessMetric("process_resident_memory_bytes", "gauge",
                                 "Resident memory size in bytes.", mem[1]))
    start = _start_time()
    if start is not None:
        out.append(ProcessMetric("process_start_time_seconds", "gauge",
                                 "Start time of the process since unix epoch in seconds.",
                                 start))
    fds = _open_fds()
    if fds is not None:
        out.append(ProcessMetric("process_open_fds", "gauge",
                                 "Number of open file descriptors.", fds))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY:
        out.append(ProcessMetric("process_max_fds", "gauge",
                                 "Maximum number of open file descriptors.", soft))
    return out
