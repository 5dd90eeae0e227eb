"""The simulator against the real thing: two lameduck processes behind a real HAProxy
(``mode tcp``: each client connection is one connection to a lameduck, as through a Kubernetes
Service), one SIGTERM drain, on loopback; then the same scenario simulated.

- With the defaults and 50 keep-alive clients: the connection closes the clients see over time
  follow the simulated distribution (two-sample Kolmogorov-Smirnov, p > 0.01), and no request
  fails in either.
- With ``shutdown.min_drain: 0s``, HAProxy without retries and clients that open a connection
  per request: the idle process exits at once while HAProxy still routes to it; the requests
  refused until HAProxy marks it DOWN number the same as simulated, within 20 %.

HAProxy's moment of marking the server DOWN depends on where its check timer stood at the
SIGTERM; it is measured (stats socket) and given to the simulation as the checks' phase, so
what is compared is lameduck's drain and the clients, not HAProxy's timer.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lameduck.sim.fleet import simulate
from lameduck.sim.ks import ks_2samp
from lameduck.sim.scenario import scenario_from
from lameduck.sim.walk import How
from tests.procs import base_config

CLIENTS = 50
THINK = 1.0  # keep-alive clients: mean think time between requests (exponential)
ONCE_CLIENTS = 20
ONCE_THINK = 0.1  # one-request clients: a new connection every 0.1 s on average each
WARM = 1.5  # seconds of traffic before the SIGTERM
SIM_RUNS = 12  # simulations pooled for the reference distribution


@dataclass
class Seen:
    closes: list[float] = field(default_factory=list)  # monotonic times
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    failed_at: list[float] = field(default_factory=list)
    requests_at: list[float] = field(default_factory=list)

    def fail(self, why: str) -> None:
        self.failed.append(why)
        self.failed_at.append(time.monotonic())


REQUEST = b"GET / HTTP/1.1\r\nHost: sim\r\n\r\n"


async def _response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length, close = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
        elif name.strip().lower() == "connection" and "close" in value.lower():
            close = True
    if length:
        await asyncio.wait_for(reader.readexactly(length), 5)
    return status, close


async def keepalive_client(port: int, seen: Seen, stop: asyncio.Event, rnd: random.Random
                           ) -> None:
    """Connect, then think / request until the connection ends; then think and reconnect.
    A close while thinking (the proxy closed it idle) is seen at once by a pending read."""
    await asyncio.sleep(rnd.uniform(0.0, 0.5))
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as e:
            seen.fail(f"connect: {e}")
            await asyncio.sleep(rnd.expovariate(1.0 / THINK))
            continue
        try:
            first = True
            while not stop.is_set():
                if not first:
                    try:
                        data = await asyncio.wait_for(reader.read(1),
                                                      rnd.expovariate(1.0 / THINK))
                    except TimeoutError:
                        pass
                    else:
                        if data:
                            seen.fail(f"unexpected bytes {data!r}")
                        seen.closes.append(time.monotonic())
                        break
                first = False
                writer.write(REQUEST)
                seen.requests_at.append(time.monotonic())
                try:
                    status, close = await _response(reader)
                except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as e:
                    seen.fail(f"request: {type(e).__name__}")
                    seen.closes.append(time.monotonic())
                    break
                if status == 200:
                    seen.ok += 1
                else:
                    seen.fail(f"status {status}")
                if close:
                    seen.closes.append(time.monotonic())
                    break
        finally:
            writer.close()
        if not stop.is_set():
            await asyncio.sleep(rnd.expovariate(1.0 / THINK))


async def once_client(port: int, seen: Seen, stop: asyncio.Event, rnd: random.Random) -> None:
    """A connection per request, a think time between their starts (open loop: how long one
    takes, a refusal through HAProxy included, does not delay the next; a refused request is
    not retried)."""
    start = time.monotonic()
    while not stop.is_set():
        start += rnd.expovariate(1.0 / ONCE_THINK)
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        seen.requests_at.append(time.monotonic())
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as e:
            seen.fail(f"connect: {e}")
            continue
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n\r\n")
            status, _ = await _response(reader)
            if status == 200:
                seen.ok += 1
            else:
                seen.fail(f"status {status}")
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError) as e:
            seen.fail(f"request: {type(e).__name__}")
        finally:
            writer.close()


def deadline(time_: str) -> str:
    """T + 2 s: room for what is in flight at T."""
    return f"{float(time_.removesuffix('s')) + 2:g}s"


def drain_config(origin_port: int, min_drain: str | None, time_: str) -> dict[str, Any]:
    cfg = base_config(origin_port, drain={"time": time_, "strategy": "gradual",
                                          "connection_grace": "200ms"})
    cfg["shutdown"] = {"deadline": deadline(time_), "stop_accepting": "at_drain_end"}
    if min_drain is not None:
        cfg["shutdown"]["min_drain"] = min_drain
    cfg["listeners"][0]["idle_timeout"] = "60s"
    return cfg


def run_real(lameduck: Any, haproxy: Any, origin_port: int, *, min_drain: str | None,
             time_: str, interval: float, fall: int, retries: int, keepalive: bool,
             after: float) -> tuple[Seen, float, float | None, float]:
    """Start it all, load it, SIGTERM the first lameduck; (what the clients saw, SIGTERM's
    monotonic time, HAProxy's DOWN delay after it, the lameduck's exit delay)."""
    lds = [lameduck(drain_config(origin_port, min_drain, time_)) for _ in range(2)]
    h = haproxy([ld.port for ld in lds], mode="tcp", interval=interval, fall=fall,
                retries=retries)
    for s in h.servers:
        assert h.wait_state(s, "UP", timeout=10) is not None, (h.server_states(), h.log())
    seen = Seen()
    out: dict[str, float | None] = {}

    async def main() -> None:
        stop = asyncio.Event()
        rnd = random.Random(7)
        if keepalive:
            tasks = [asyncio.create_task(keepalive_client(h.port, seen, stop,
                                                          random.Random(rnd.random())))
                     for _ in range(CLIENTS)]
        else:
            tasks = [asyncio.create_task(once_client(h.port, seen, stop,
                                                     random.Random(rnd.random())))
                     for _ in range(ONCE_CLIENTS)]
        await asyncio.sleep(WARM)
        t0 = time.monotonic()
        os.kill(lds[0].pid, signal.SIGTERM)

        async def exited() -> None:
            await asyncio.to_thread(lds[0].wait, 10.0)
            out["exit"] = time.monotonic() - t0

        gone = asyncio.create_task(exited())
        down = await asyncio.to_thread(h.wait_state, "s1", "DOWN", 10.0)
        out["t0"], out["down"] = t0, None if down is None else time.monotonic() - t0
        await gone
        await asyncio.sleep(max(0.0, t0 + after - time.monotonic()))
        stop.set()
        await asyncio.wait(tasks, timeout=10)
        for t in tasks:
            t.cancel()

    asyncio.run(main())
    t0 = out["t0"]
    assert t0 is not None and out["exit"] is not None
    return seen, t0, out["down"], out["exit"]


def sim_scenario(*, min_drain: str | None, time_: str, interval: float, fall: int,
                 phase: float, keepalive: bool, at: float, rate: float = 1.0 / THINK) -> Any:
    lameduck: dict[str, Any] = {"drain": {"time": time_, "strategy": "gradual",
                                          "connection_grace": "200ms"},
                                "shutdown": {"deadline": deadline(time_)}}
    if min_drain is not None:
        lameduck["shutdown"]["min_drain"] = min_drain
    clients = ([{"count": CLIENTS, "protocol": "http1", "rate": 1.0 / THINK,
                 "duration": "2ms", "reconnect": "next_request"}] if keepalive else
               [{"count": ONCE_CLIENTS, "protocol": "once", "rate": rate,
                 "duration": "3ms"}])
    return scenario_from({
        "name": "crosscheck",
        "pod": {"kind": "Pod", "spec": {"terminationGracePeriodSeconds": 30,
                                        "containers": [{"name": "lameduck"}]}},
        "lameduck": lameduck,
        "lb": {"kind": "health_check", "interval": interval, "fall": fall,
               "balance": "round_robin", "phase": phase},
        "fleet": {"replicas": 2, "capacity": 1000},
        "clients": clients,
        "drain": {"at": at, "instances": 1},
        "warmup": "500ms", "duration": at + 8.0, "resolution": "1ms",
    }, Path("."), "crosscheck")


def phase_for(down: float, at: float, interval: float, fall: int) -> float:
    """The checks' phase that has the simulated LB mark the pod DOWN ``down`` s after ``at``."""
    first = down - (fall - 1) * interval
    return (at + min(max(first, 0.0), interval - 1e-6)) % interval


@pytest.mark.timeout(120)
def test_closes_and_failures_match_the_simulation(lameduck: Any, haproxy: Any,
                                                  origin_port: int) -> None:
    # --- the defaults (min_drain unset: serve until T), 50 keep-alive clients -------------
    interval, fall, window = 0.2, 2, 3.0
    seen, t0, down, exit_ = run_real(lameduck, haproxy, origin_port, min_drain=None,
                                     time_="2s", interval=interval, fall=fall, retries=3,
                                     keepalive=True, after=window + 0.5)
    assert down is not None, "HAProxy never marked the drained lameduck DOWN"
    real = np.asarray([c - t0 for c in seen.closes if 0.0 <= c - t0 <= window])
    at = 3.0
    sc = sim_scenario(min_drain=None, time_="2s", interval=interval, fall=fall,
                      phase=phase_for(down, at, interval, fall), keepalive=True, at=at)
    simulated: list[np.ndarray] = []
    sim_failed = 0
    for seed in range(SIM_RUNS):
        res = simulate(sc, seed=seed, record=True)
        assert res.close_log is not None
        times, hows, _ = res.close_log
        rel = times - at
        simulated.append(rel[(rel >= 0.0) & (rel <= window) & (hows != How.DONE)])
        sim_failed += sum(int(v.sum()) for v in res.failures.values())
    sim = np.concatenate(simulated)
    d, p = ks_2samp(real, sim)
    print(f"\nreal: {real.size} closes in {window}s after SIGTERM (HAProxy DOWN after "
          f"{down:.2f}s, exit after {exit_:.2f}s), {seen.ok} ok, {len(seen.failed)} failed; "
          f"simulated: {sim.size / SIM_RUNS:.1f} closes per run, {sim_failed} failed in "
          f"{SIM_RUNS} runs; KS D={d:.3f} p={p:.3f}")
    print("real closes (s):", np.round(np.sort(real), 2).tolist())
    print("simulated deciles (s):", np.round(np.quantile(sim, np.linspace(0, 1, 11)),
                                             2).tolist())
    assert real.size >= 20, (real.size, seen.failed[:5])
    assert seen.failed == [] and sim_failed == 0, seen.failed[:5]
    assert p > 0.01
    # the count of closes agrees too (Poisson noise on ~30: a wide band)
    assert 0.6 <= real.size / (sim.size / SIM_RUNS) <= 1.6

    # --- min_drain 0s, no HAProxy retries, one-request clients ----------------------------
    interval, fall = 2.0, 2
    seen, t0, down, exit_ = run_real(lameduck, haproxy, origin_port, min_drain="0s",
                                     time_="6s", interval=interval, fall=fall, retries=0,
                                     keepalive=False, after=0.0)
    assert down is not None, "HAProxy never marked the drained lameduck DOWN"
    real_failed = sum(1 for f in seen.failed_at if f >= t0)
    sc = sim_scenario(min_drain="0s", time_="6s", interval=interval, fall=fall,
                      phase=phase_for(down, at, interval, fall), keepalive=False, at=at,
                      rate=1.0 / ONCE_THINK)
    counts = []
    for seed in range(SIM_RUNS):
        res = simulate(sc, seed=seed)
        counts.append(sum(int(v[int(at / 0.1):].sum()) for v in res.failures.values()))
    sim_mean = float(np.mean(counts))
    sent = sum(1 for r in seen.requests_at if t0 <= r < t0 + down)
    print(f"min_drain 0s: HAProxy DOWN after {down:.2f}s, lameduck exit after {exit_:.2f}s, "
          f"{sent} requests sent meanwhile; "
          f"failed: real {real_failed} ({sorted(set(seen.failed))[:3]}), simulated "
          f"{sim_mean:.1f} (runs {min(counts)}..{max(counts)})")
    assert exit_ < down, "the idle lameduck should exit before HAProxy notices"
    assert sim_mean > 50
    assert abs(real_failed - sim_mean) <= 0.2 * sim_mean
