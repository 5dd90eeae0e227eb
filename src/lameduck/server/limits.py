"""The descriptor limit: `lameduck run` raises its soft RLIMIT_NOFILE to the hard limit at start.

Every downstream connection may need an upstream one too, so the soft limit bounds how many
clients one process holds (listeners/base.py ``downstream_cap``). The soft limit is often the
historical 1024 (select(2)'s FD_SETSIZE) while the hard limit is far higher; lameduck uses
epoll, so it takes the hard limit, as HAProxy does (it sizes its maxconn from the hard limit)
and nginx's ``worker_rlimit_nofile`` is for. An operator who wants fewer sets the hard limit
(systemd's ``LimitNOFILE=``, ``ulimit -Hn``, Docker's ``--ulimit nofile=``).
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("lameduck")

NR_OPEN = "/proc/sys/fs/nr_open"  # Linux: the most RLIMIT_NOFILE may be (setrlimit(2) EPERM)


def _ceiling(hard: int) -> int:
    """The hard limit, or for an unlimited one what the kernel accepts (fs.nr_open)."""
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        with open(NR_OPEN, encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20  # Linux's default nr_open


def raise_nofile() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; (soft before, soft now), logged. A raise
    the kernel refuses leaves the soft limit as it was, with a warning saying so."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling(hard)
    if soft == resource.RLIM_INFINITY or soft >= target:
        log.info("RLIMIT_NOFILE: %s open files (soft = hard limit)", _limit(soft))
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as e:
        log.warning("RLIMIT_NOFILE: cannot raise the soft limit %d to the hard limit %s: %s",
                    soft, _limit(hard), e)
        return soft, soft
    log.info("RLIMIT_NOFILE: soft limit raised from %d to %d open files (the hard limit)",
             soft, target)
    return soft, target


def _limit(n: int) -> str:
    return "unlimited" if n == resource.RLIM_INFINITY else str(n)
