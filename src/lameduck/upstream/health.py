"""Active health checks and HAProxy agent checks: the I/O around ``drain/health.py``.

A health check is one ``GET <path>`` on a fresh connection (``Connection: close``); only its
status line and headers are read, so no HTTP codec is needed here (upstream/ does not import the
codecs). An agent check connects to the endpoint's agent port and reads the one line the agent
writes (HAProxy's agent-check protocol), so existing feedback agents work unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from lameduck.drain.health import HealthCheck, parse_agent
from lameduck.stats import HealthCheckStats
from lameduck.upstream.cluster import Cluster
from lameduck.upstream.pool import Endpoint

log = logging.getLogger("lameduck.health")

IMMEDIATE_FAIL = b"x-envoy-immediate-health-check-fail"
MAX_HEAD = 16 * 1024  # a health check reads no more than this of the response head
MAX_AGENT_LINE = 1024


class CheckFailed(Exception):
    def __init__(self, network: bool, immediate: bool = False) -> None:
        super().__init__()
        self.network = network
        self.immediate = immediate


async def _http_check(ep: Endpoint, request: bytes, expected: frozenset[int]) -> None:
    """One check; raises CheckFailed (network or status) unless the status is expected."""
    try:
        reader, writer = await asyncio.open_connection(ep.host, ep.port)
    except OSError:
        raise CheckFailed(network=True) from None
    try:
        writer.write(request)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            try:
                head = await reader.read(MAX_HEAD)  # a huge head: its status line will do
            except OSError:
                raise CheckFailed(network=True) from None
        except (asyncio.IncompleteReadError, OSError):
            raise CheckFailed(network=True) from None
    finally:
        writer.transport.abort()
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise CheckFailed(network=False)
    status = int(parts[1])
    if status not in expected:
        immediate = status == 503 and IMMEDIATE_FAIL in head.lower()
        raise CheckFailed(network=False, immediate=immediate)


async def read_agent(host: str, port: int) -> bytes:
    """The agent's one line (up to its newline, or what it wrote before closing)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        data = b""
        while b"\n" not in data and len(data) < MAX_AGENT_LINE:
            more = await reader.read(MAX_AGENT_LINE)
            if not more:
                break
            data += more
        return data.split(b"\n", 1)[0]
    finally:
        writer.transport.abort()


class HealthChecker:
    """Checks every endpoint of a cluster every ``interval`` and moves its health."""

    def __init__(self, cluster: Cluster, loop: asyncio.AbstractEventLoop, cfg: Any,
                 stats: HealthCheckStats) -> None:
        self.cluster = cluster
        self.loop = loop
        self.cfg = cfg
        self.stats = stats
        self.expected = frozenset(cfg.expected_statuses)
        self.checks = {ep: HealthCheck(cfg.rise, cfg.fall) for ep in cluster.endpoints}
        self.tasks: list[asyncio.Task[None]] = []
        stats.healthy = len(cluster.endpoints)

    def start(self) -> None:
        for ep in self.cluster.endpoints:
            self.tasks.append(self.loop.create_task(self._run(ep)))

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()

    def _request(self, ep: Endpoint) -> bytes:
        host = self.cfg.host or ep.address
        return (b"GET %s HTTP/1.1\r\nhost: %s\r\nuser-agent: lameduck-health-check\r\n"
                b"connection: close\r\n\r\n" % (self.cfg.path.encode(), host.encode()))

    async def _run(self, ep: Endpoint) -> None:
        cfg = self.cfg
        request = self._request(ep)
        loop = self.loop
        while True:
            # A fixed rate: checks start `interval` apart, however long each takes (so fall
            # failures take an endpoint out within about interval x fall, not that plus the
            # checks' own time; a check slower than the interval is followed at once).
            next_at = loop.time() + cfg.interval
            try:
                await self.check_once(ep, request)
            except Exception:  # a check must never end the endpoint's checking
                log.exception("cluster %s endpoint %s: health check failed unexpectedly",
                              self.cluster.name, ep.address)
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def check_once(self, ep: Endpoint, request: bytes) -> None:
        st = self.stats
        st.attempt += 1
        hc = self.checks[ep]
        # Envoy's counting: `failure` is every failed check, `network_failure` those that
        # could not connect, were reset or timed out.
        try:
            await asyncio.wait_for(_http_check(ep, request, self.expected), self.cfg.timeout)
        except CheckFailed as e:
            st.failure += 1
            if e.network:
                st.network_failure += 1
            changed = hc.failure(immediate=e.immediate)
        except TimeoutError:
            st.failure += 1
            st.network_failure += 1
            changed = hc.failure()
        else:
            st.success += 1
            changed = hc.success()
        if changed:
            ep.hc_ok = hc.healthy
            log.warning("cluster %s endpoint %s health check: %s", self.cluster.name,
                        ep.address, "healthy" if hc.healthy else "unhealthy")
            st.healthy = sum(1 for c in self.checks.values() if c.healthy)
            self.cluster.health_changed(ep)


class AgentChecker:
    """Asks each endpoint's agent for its words every ``interval``. An admin word (ready,
    drain, maint) is applied when the agent's word changes, so an operator's later change by
    the admin API stands until the agent says something new; an unreachable agent changes
    nothing (HAProxy: connectivity is the health check's business)."""

    def __init__(self, cluster: Cluster, loop: asyncio.AbstractEventLoop, cfg: Any) -> None:
        self.cluster = cluster
        self.loop = loop
        self.cfg = cfg
        self.last_admin: dict[Endpoint, object] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for ep in self.cluster.endpoints:
            if ep.agent_port is not None:
                self.tasks.append(self.loop.create_task(self._run(ep)))

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()

    async def _run(self, ep: Endpoint) -> None:
        while True:
            try:
                await self.check_once(ep)
            except Exception:  # an agent's nonsense must never end the asking
                log.exception("cluster %s endpoint %s: agent check failed unexpectedly",
                              self.cluster.name, ep.address)
            await asyncio.sleep(self.cfg.interval)

    async def check_once(self, ep: Endpoint) -> None:
        assert ep.agent_port is not None
        try:
            line = await asyncio.wait_for(read_agent(ep.host, ep.agent_port), self.cfg.timeout)
        except (OSError, TimeoutError):
            return
        with contextlib.suppress(UnicodeDecodeError):
            ep.agent_said = line.decode("ascii").strip()
        report = parse_agent(line)
        if report.admin is not None:
            if self.last_admin.get(ep) == report.admin:
                report = dataclasses.replace(report, admin=None)
            else:
                self.last_admin[ep] = report.admin
        self.cluster.agent_report(ep, report, self.loop.time())

