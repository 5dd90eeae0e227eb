"""The simulator's scale: one rolling update of 1,000 instances and 1,000,000 clients over 10
minutes of virtual time (bench/sim-scale.yaml), timed. A benchmark, not a test: it prints the
wall time, the events per second and whether the 60 s target was met; nothing fails.

    .venv/bin/python bench/sim_scale.py [SCENARIO] [--seed N]

Events are the engine's timed events plus every connect and close it handled (each is an event
of the model, taken in batches)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lameduck.sim.fleet import simulate
from lameduck.sim.report import summary, text
from lameduck.sim.scenario import load_scenario

TARGET = 60.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", nargs="?", default=str(Path(__file__).with_name("sim-scale.yaml")))
    p.add_argument("--seed", type=int)
    args = p.parse_args()
    sc = load_scenario(args.scenario)
    clients = sum(c.count for c in sc.clients)
    print(f"{sc.name}: {sc.replicas} instances, {clients} clients, {sc.duration:g} s virtual",
          flush=True)
    t0 = time.perf_counter()
    last = [t0]

    def progress(now: float) -> None:
        if time.perf_counter() - last[0] > 5:
            last[0] = time.perf_counter()
            print(f"  virtual {now:6.1f} s after {last[0] - t0:5.1f} s wall", flush=True)

    res = simulate(sc, args.seed, progress)
    wall = time.perf_counter() - t0
    print(text([res]))  # the figures, events/s among them (none when the run took no time)
    print(f"wall {wall:.1f} s in all, {summary(res)['events']} events")
    print(f"target: < {TARGET:g} s wall: {'met' if wall < TARGET else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
