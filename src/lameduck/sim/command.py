"""What ``lameduck simulate`` does with its arguments: load, run (with a progress bar on a
terminal), print the figures side by side, write JSON/CSV/PNG; or ``--solve``."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import IO

import yaml

from lameduck.sim import report
from lameduck.sim.fleet import Result, simulate
from lameduck.sim.scenario import Scenario, ScenarioError, load_scenario

EXIT_BAD_INPUT = 2


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _open(path: str) -> Iterator[IO[str]]:
    if path == "-":
        yield sys.stdout
    else:
        with open(path, "w", encoding="utf-8", newline="") as f:
            yield f


def _run(sc: Scenario, seed: int | None, bar: bool) -> Result:
    if not bar:
        return simulate(sc, seed)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed:.0f}/{task.total:.0f} virtual s"),
                  TimeElapsedColumn(), console=None, transient=True) as progress:
        task = progress.add_task(sc.name, total=sc.duration)
        return simulate(sc, seed, lambda now: progress.update(task, completed=now))


def main(args: argparse.Namespace) -> int:
    """Exit 0 ran (or --solve found values), 1 --solve found none, 2 bad input."""
    if len(args.scenario) > 1 and not args.compare:
        _say("lameduck: simulate: several scenarios: give --compare to run them side by side")
        return EXIT_BAD_INPUT
    if args.solve and len(args.scenario) > 1:
        _say("lameduck: simulate: --solve takes one scenario")
        return EXIT_BAD_INPUT
    try:
        scenarios = [load_scenario(p) for p in args.scenario]
    except ScenarioError as e:
        _say(f"lameduck: simulate: {e}")
        return EXIT_BAD_INPUT
    if args.solve:
        from lameduck.sim.solve import solve

        got = solve(scenarios[0], args.max_reconnects, args.seed, say=_say)
        try:
            if args.json:
                with _open(args.json) as f:
                    json.dump(got, f, indent=2)
                    f.write("\n")
        except OSError as e:
            _say(f"lameduck: simulate: {e}")
            return 1
        if args.json != "-":  # stdout holds the JSON alone, to be parsed
            shown = {k: v for k, v in got.items() if k != "trials"}
            print(yaml.safe_dump(shown, sort_keys=False).rstrip())
        return 0 if got["found"] else 1
    bar = args.progress if args.progress is not None else sys.stderr.isatty()
    results = [_run(sc, args.seed, bar) for sc in scenarios]
    if "-" not in (args.json, args.csv, args.instances_csv):
        print(report.text(results))  # else stdout holds that file alone, to be parsed
    try:
        if args.json:
            with _open(args.json) as f:
                report.write_json(results, f)
        if args.csv:
            with _open(args.csv) as f:
                report.write_csv(results, f)
        if args.instances_csv:
            with _open(args.instances_csv) as f:
                report.write_instances_csv(results[0], f)
        if args.png:
            from lameduck.sim.plot import draw

            _say(draw(results, args.png))
    except OSError as e:
        _say(f"lameduck: simulate: {e}")
        return 1
    return 0
