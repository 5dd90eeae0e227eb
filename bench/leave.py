#!/usr/bin/env python3
"""How long one instance stays out of rotation before its drain, and what that costs, behind a
real load balancer: HAProxy health-checking two lameducks (``inter 300ms fall 3 rise 2``),
clients through HAProxy, ``lameduck prestop --strategy deregister-first`` on lameduck #1, then
the SIGTERM a kubelet sends once the preStop hook has returned (the harness is
tests/lbharness.py, shared with tests/integration/test_lb_confirm.py).

Scenarios, each run ``--runs`` times on a fresh fleet:

- ``A-short``: ``--lb-buffer 300ms``, shorter than HAProxy's detection time (3 checks, 0.6 s
  to 0.9 s): the drain, and maybe the exit, come before HAProxy marked the server DOWN;
- ``A-long``: ``--lb-buffer 2s``, longer than it: nothing should fail, at the price of the
  whole buffer;
- ``B``: ``--leave confirm --lb-buffer 30s``: CLOSING ends once the probers have seen the
  server fail; run only when this tree's ``lameduck prestop`` takes ``--leave``.

The SIGTERM comes as soon as ``/server_info`` says the FSM is CLOSED (``--sigterm closed``,
the default: what the rule alone gives) or once ``lameduck prestop`` has exited
(``--sigterm hook``: as a preStop hook runs it, its polling and its exit on top).

Printed: per run, then one table row per scenario (medians over the runs, failures summed).
A benchmark, not a test: nothing fails on a slow machine. ``make bench-leave``
(``.venv/bin/python bench/leave.py --help``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.lbharness import (  # noqa: E402
    FALL,
    SIGTERM_ON,
    Leave,
    fleet,
    has_leave_flag,
    run_leave,
)


def scenarios(short: str, long: str, bound: str, confirm: bool) -> list[tuple[str, list[str],
                                                                              dict]]:
    base = ["--strategy", "deregister-first", "--drain-timeout", "10s", "--lb-buffer"]
    out: list[tuple[str, list[str], dict]] = [
        ("A-short", [*base, short], {}),
        ("A-long", [*base, long], {}),
    ]
    if confirm:
        out.append(("B", [*base, bound, "--leave", "confirm"],
                    {"lb_probes": {"fall": FALL}}))
    return out


def _med(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    if len(got) == 1:
        return f"{got[0]:.3f}"
    return f"{statistics.median(got):.3f} ({min(got):.3f}-{max(got):.3f})"


def table(results: dict[str, tuple[str, list[Leave]]], missing: list[tuple[str, str]]) -> str:
    """One row per scenario; ``missing``: (scenario, --lb-buffer) not run, said so."""
    head = ("scenario", "--lb-buffer", "runs", "CLOSING s", "HAProxy DOWN s",
            "SIGTERM s", "exit s", "requests", "failed")
    rows = [head]
    for name, (buffer, runs) in results.items():
        rows.append((
            name, buffer, str(len(runs)),
            _med([r.closing for r in runs]),
            _med([r.down_after for r in runs]),
            _med([r.sigterm_at - r.start for r in runs]),
            _med([r.exited - r.start for r in runs]),
            str(sum(r.requests for r in runs)),
            f"{sum(r.counts.failed for r in runs)} "
            f"({', '.join(str(r.counts.failed) for r in runs)})",
        ))
    for name, buffer in missing:
        rows.append((name, buffer, "0", "not built yet", "-", "-", "-", "-", "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs per scenario (default 3)")
    ap.add_argument("--short", default="300ms", help="A-short's --lb-buffer (300ms)")
    ap.add_argument("--long", default="2s", help="A-long's --lb-buffer (2s)")
    ap.add_argument("--bound", default="30s", help="B's --lb-buffer, its upper bound (30s)")
    ap.add_argument("--sigterm", choices=SIGTERM_ON, default="closed",
                    help="when the SIGTERM comes: 'closed', as soon as /server_info says the "
                         "FSM is CLOSED (the default: the rule alone); 'hook', once "
                         "'lameduck prestop' has exited (as shipped: its polling and exit on "
                         "top)")
    ap.add_argument("--keepalive", type=int, default=4,
                    help="keep-alive clients (4); each waits for its answer before the next")
    ap.add_argument("--fresh", type=int, default=2,
                    help="clients opening a connection per request (2)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only this scenario (A-short, A-long, B); repeatable")
    args = ap.parse_args()
    confirm = has_leave_flag()
    chosen = [s for s in scenarios(args.short, args.long, args.bound, confirm)
              if not args.only or s[0] in args.only]
    results: dict[str, tuple[str, list[Leave]]] = {}
    when = {"closed": "once the FSM was CLOSED", "hook": "once lameduck prestop exited"}
    print("HAProxy 'inter 300ms fall 3 rise 2' in front of two lameducks; times in seconds "
          f"from the preStop FSM's start; SIGTERM {when[args.sigterm]}")
    with tempfile.TemporaryDirectory(prefix="lameduck-leave-") as tmp:
        for name, prestop_args, listener in chosen:
            buffer = prestop_args[prestop_args.index("--lb-buffer") + 1]
            results[name] = (buffer, [])
            for i in range(args.runs):
                t = time.monotonic()
                with fleet(Path(tmp) / f"{name}-{i}", listener=listener,
                           check_traceback=False) as f:
                    run = run_leave(f, name, prestop_args, sigterm_on=args.sigterm,
                                    keepalive=args.keepalive, fresh=args.fresh)
                results[name][1].append(run)
                print(f"{run.row()} [{time.monotonic() - t:.0f}s]", flush=True)
                if run.counts.failed:
                    print(f"    failures: {run.counts.samples[:3]} at "
                          f"{run.failures_from_start()[:6]}s", flush=True)
    if not confirm:
        print("B (--leave confirm): not run, this tree's 'lameduck prestop' has no --leave")
    print()
    missing = [] if confirm or (args.only and "B" not in args.only) else [("B", args.bound)]
    print(table(results, missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
