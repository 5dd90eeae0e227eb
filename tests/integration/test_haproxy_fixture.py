"""Self-tests of the ``haproxy`` fixture (tests/haproxy.py) over real processes: HAProxy in
front of two lameduck instances, health-checking their health-check path, follows
``/healthcheck/fail`` and ``/healthcheck/ok`` on one lameduck's admin port."""

from __future__ import annotations

import httpx
import pytest

from tests.haproxy import Haproxy
from tests.procs import Lameduck

UPSTREAM = "cluster.app.upstream_rq_total"  # requests a lameduck forwarded to the origin
SLACK = 1.0  # seconds beyond inter x fall (or rise): scheduling, check spread, polling


def _served(h: Haproxy, lds: list[Lameduck], n: int) -> list[int]:
    """Send ``n`` GETs through HAProxy (one keep-alive client); each must get a 200. How many
    each lameduck forwarded meanwhile (health checks are answered locally, not forwarded)."""
    before = [ld.stat(UPSTREAM) for ld in lds]
    with httpx.Client(timeout=5) as client:
        for _ in range(n):
            r = client.get(h.url("/"))
            assert r.status_code == 200, (r.status_code, r.text, h.log())
    return [ld.stat(UPSTREAM) - b for ld, b in zip(lds, before, strict=True)]


def test_config_rejected_with_error(haproxy, tmp_path) -> None:
    """An invalid config fails before HAProxy starts, with HAProxy's error in the message."""
    h = Haproxy([1], tmp_path / "bad", start=False)
    try:
        h.cfg.write_text(h.cfg.read_text() + "    bogus_keyword 1\n")
        with pytest.raises(RuntimeError, match="bogus_keyword"):
            h.check_config()
    finally:
        h.stop()  # the listening socket it holds for HAProxy


def test_lb_follows_lameduck_healthcheck_fail_and_ok(haproxy, lameduck, origin_port) -> None:
    lds = [lameduck(), lameduck()]
    h = haproxy([ld.port for ld in lds])  # inter 200ms, fall 2, rise 2
    for s in h.servers:
        assert h.wait_state(s, "UP", timeout=5) is not None, (h.server_states(), h.log())

    # Round robin over both: every request a 200, each lameduck forwards half.
    assert _served(h, lds, 20) == [10, 10]

    # s1's lameduck fails its health check: HAProxy marks s1 DOWN after `fall` checks.
    assert lds[0].admin("POST", "/healthcheck/fail").status_code == 200
    down = h.wait_state("s1", "DOWN", timeout=h.interval * h.fall + SLACK)
    print(f"\ns1 DOWN after {down}s (inter {h.interval}s x fall {h.fall})")
    assert down is not None, (h.server_states(), h.log())
    assert h.server_states()["s2"] == "UP"
    assert _served(h, lds, 10) == [0, 10]

    # Healthy again: UP after `rise` checks, and traffic spreads over both again.
    assert lds[0].admin("POST", "/healthcheck/ok").status_code == 200
    up = h.wait_state("s1", "UP", timeout=h.interval * h.rise + SLACK)
    print(f"s1 UP after {up}s (inter {h.interval}s x rise {h.rise})")
    assert up is not None, (h.server_states(), h.log())
    assert _served(h, lds, 20) == [10, 10]

    # -db: HAProxy prints server state changes to its captured output.
    assert "be/s1 is DOWN" in h.log() and "be/s1 is UP" in h.log(), h.log()
