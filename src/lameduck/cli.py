"""The ``lameduck`` command: one function per subcommand, thin; the work is in server/."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

from lameduck import __version__
from lameduck.config import ConfigError, format_duration, parse_duration
from lameduck.orchestrate.budget import PRESTOP_LEAVES, PRESTOP_STRATEGIES
from lameduck.orchestrate.lbpresets import LB_PRESETS
from lameduck.restart import listen_fds, match_listeners
from lameduck.server.boot import (
    EXIT_CONFIG,
    EXIT_LISTEN,
    DemoOrigin,
    RunOptions,
    load_config_or_default,
    load_or_report,
    run,
    run_loop,
    say_config_error,
)
from lameduck.server.lifecycle import exit_now
from lameduck.server.logfile import formatter as log_formatter
from lameduck.server.logfile import open_log_file
from lameduck.upstream.errlog import DEFAULT_INTERVAL as DEFAULT_ERRLOG_INTERVAL
from lameduck.upstream.errlog import set_interval as set_errlog_interval

EXIT_PIPE = 128 + signal.SIGPIPE  # stdout's reader went away


def cmd_run(args: argparse.Namespace) -> int:
    """Does not return: the process ends with run's exit code as soon as it is known
    (exit_now), not after the interpreter's teardown."""
    from lameduck.demo.origin import serve, shutdown

    exit_now(run(RunOptions(args.config, args.hot_restart, args.admin_address_path,
                            args.log_file, _log_argv(args), DemoOrigin(serve, shutdown))))
    return 0  # not reached


def _log_argv(args: argparse.Namespace) -> list[str]:
    """The global log options as given, for a process this one starts (a hot-restart
    successor, a supervised child, a worker): it logs the way this one does."""
    return ["--log-level", args.log_level, "--log-format", args.log_format,
            "--upstream-error-log-every", format_duration(args.upstream_error_log_every)]


def cmd_supervise(args: argparse.Namespace) -> int:
    cfg = load_or_report(args.config)
    if cfg is None:
        return EXIT_CONFIG
    try:
        # the supervisor holds systemd's sockets and passes them on to each child
        passed = match_listeners(cfg.listeners, listen_fds())
    except ValueError as e:
        print(f"lameduck: socket activation: {e}", file=sys.stderr)
        return EXIT_LISTEN
    from lameduck.restart.supervisor import supervise

    # the supervisor's exit is the unit's: at once, as its child's (exit_now)
    exit_now(run_loop(lambda: supervise(args.config, _log_argv(args), args.admin_address_path,
                                         passed)))
    return 0  # not reached


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        cfg = load_config_or_default(args.config)
    except ConfigError as e:
        say_config_error(e)
        return EXIT_CONFIG
    print(f"{args.config or '<embedded default>'}: OK ({len(cfg.listeners)} listeners, "
          f"{len(cfg.clusters)} clusters)")
    return 0


class _Version(argparse.Action):
    """``lameduck 0.1.0 (compiled: mypyc)`` or ``(pure Python)``: which one runs is found
    only when asked (hotpath.py looks up every hot module)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from lameduck.hotpath import build_kind

        print(f"lameduck {__version__} ({build_kind()})")
        parser.exit()


def _duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _count_arg(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def cmd_budget(args: argparse.Namespace) -> int:
    """Check the drain's timer chain; exit 0 all hold, 1 one breaks, 2 bad input."""
    import json

    import yaml

    from lameduck.orchestrate import budget as bud
    from lameduck.orchestrate import lbpresets as lbp

    cfg = load_or_report(args.config)
    if cfg is None:
        return EXIT_CONFIG
    try:
        with open(args.pod, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
        if not docs:
            raise bud.BudgetError("the file holds no YAML document")
        pod = bud.pod_timers(docs[0], args.container)
        lb, delay = lbp.lb_settings(args.lb, interval=args.lb_interval, fall=args.lb_fall,
                                    rise=args.lb_rise,
                                    deregistration_delay=args.lb_deregistration_delay)
        b = bud.budget_from(cfg, pod, max_request=args.max_request, prestop=args.prestop,
                            exit_margin=args.exit_margin, **lb,
                            lb_buffer=args.lb_buffer, lb_idle=args.lb_idle,
                            client_idle=args.client_idle)
    except (OSError, yaml.YAMLError, bud.BudgetError) as e:
        print(f"lameduck: budget: {args.pod}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    ineqs = bud.check(b)
    ok = all(q.holds for q in ineqs)
    solved = bud.solve(b) if args.solve else None
    notes = [*pod.notes, *pod.prestop.notes]
    preset = lbp.LB_PRESETS[args.lb] if args.lb else None
    warning = lbp.deregistration_warning(delay, b.grace_period,
                                         preset.name if preset else "load balancer")
    warnings = [warning] if warning else []
    leaves = bud.confirmed_leaves(cfg.drain.report_dir) if cfg.drain.report_dir else []
    for lv in leaves:  # the confirmed path, as the last drains took it; the bound is counted
        took = lv.get("confirmed_after")
        notes.append(f"leave: confirm ({lv.get('by')}) in {lv['report']}: "
                     + (f"confirmed after {took}s" if took is not None else "the bound won")
                     + f" (bound {lv.get('bound')}s)")
    if args.json:
        out: dict[str, Any] = {"ok": ok, "prestop": pod.prestop.source, "notes": notes,
                               "lb": preset.as_dict() if preset else None,
                               "deregistration_delay": delay, "warnings": warnings,
                               "inequalities": [q.as_dict() for q in ineqs]}
        if solved is not None:
            out["proposal"] = bud.proposal(cfg, b, solved)
        print(json.dumps(out, indent=2))
        return 0 if ok else 1
    print(f"preStop: {pod.prestop.source} = {format_duration(b.prestop)}"
          + ("" if args.prestop is None else " (--prestop)"))
    for note in notes:
        print(f"note: {note}")
    if preset is not None:
        print(f"lb: {preset.name}: {preset.title}: interval {format_duration(b.lb_interval)}"
              f" x fall {b.lb_fall}, deregistration delay "
              + ("none" if delay is None else f"{delay:g}s"))
        for note in preset.notes:
            print(f"note: {preset.name}: {note}")
    for w in warnings:
        print(f"warning: {w}")
    print("\n".join(bud.render(ineqs)))
    if solved is not None:
        print("\n# --solve: the smallest consistent values (grace = max request + LB "
              "detection + LB buffer + drain + margin)")
        print(yaml.safe_dump(bud.proposal(cfg, b, solved), sort_keys=False).rstrip())
    broken = [q.name for q in ineqs if not q.holds]
    if broken:
        print(f"lameduck: budget: broken: {', '.join(broken)}", file=sys.stderr)
    return 0 if ok else 1


def cmd_prestop(args: argparse.Namespace) -> int:
    """The preStop hook: start the health-check FSM in a running lameduck and follow it.
    Exit 0 drained clean, 3 drain_timeout passed with requests in flight, 4 admin unreachable,
    2 bad arguments. Does not return: the kubelet sends SIGTERM when the hook exits, so the
    exit comes as soon as its code is known (exit_now), not after the interpreter's teardown
    of every module this command imported (0.2 s idle, over a second on a loaded node)."""
    exit_now(_prestop(args))
    return 0  # not reached


def _prestop(args: argparse.Namespace) -> int:
    import json

    from lameduck.orchestrate.prestop import run_prestop

    admin = args.admin
    if admin is None:
        cfg = load_or_report(args.config)
        if cfg is None:
            return EXIT_CONFIG
        admin = str(cfg.admin.address)
    for value in (args.drain_timeout, args.lb_buffer):
        try:
            parse_duration(value)
        except ValueError as e:
            print(f"lameduck: prestop: {e}", file=sys.stderr)
            return EXIT_CONFIG
    def live(line: str) -> None:  # redrawn in place (a terminal only)
        sys.stderr.write("\r\x1b[2K" + line)
        sys.stderr.flush()

    code, summary = run_prestop(admin, args.strategy, args.drain_timeout, args.lb_buffer,
                                lambda line: print(line, file=sys.stderr, flush=True),
                                live=live if sys.stderr.isatty() else None,
                                leave=args.leave)
    print(json.dumps(summary, indent=2))
    return code


def cmd_top(args: argparse.Namespace) -> int:
    """A live view of a running lameduck from its admin API; one plain-text snapshot when
    stdout is not a terminal or with --once. Exit 0 (also on Ctrl-C), 2 admin unreachable."""
    import shutil

    from rich.console import Console

    from lameduck.orchestrate import top

    admin = args.admin
    if args.admin_address_path:
        try:
            with open(args.admin_address_path, encoding="utf-8") as f:
                admin = f.read().strip()
            if not admin:
                raise OSError("empty (the lameduck writing it has not served yet)")
        except OSError as e:
            print(f"lameduck top: --admin-address-path {args.admin_address_path}: {e}",
                  file=sys.stderr)
            return top.EXIT_UNREACHABLE
    elif admin is None:
        cfg = load_or_report(args.config)
        if cfg is None:
            return EXIT_CONFIG
        admin = str(cfg.admin.address)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.once or not sys.stdout.isatty():
        # no colour, no cursor codes: a file, a pipe or a ticket gets plain text; never
        # narrower than 120 columns, so endpoint addresses and stat names are not cut
        width = max(120, shutil.get_terminal_size().columns)
        plain = Console(force_terminal=False, color_system=None, no_color=True,
                        highlight=False, emoji=False, width=width)
        return top.snapshot(admin, plain, say)
    # the 16 standard colours: what every terminal over SSH shows the same way
    return top.live(admin, Console(color_system="standard", highlight=False, emoji=False), say)


def cmd_report(args: argparse.Namespace) -> int:
    """Draw a drain report (a report_dir file, or GET /drain_report's answer) as a PNG.
    Exit 0 drawn, 2 not a report, 1 matplotlib missing or the PNG cannot be written."""
    from lameduck.orchestrate.report import ReportError, draw, load_report

    try:
        report = load_report(args.file)
    except ReportError as e:
        print(f"lameduck: report: {e}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        out = draw(report, args.png)
    except ImportError:
        print("lameduck: report: needs matplotlib: pip install 'lameduck[report]'",
              file=sys.stderr)
        return 1
    except OSError as e:
        print(f"lameduck: report: {args.png}: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    """Simulate a fleet's rollout or drain on the drain core in virtual time (docs/simulate.md).
    Exit 0 ran, 1 --solve found nothing (or an output could not be written), 2 bad input."""
    try:
        from lameduck.sim.command import main as simulate_main
    except ImportError as e:
        print(f"lameduck: simulate: needs numpy and matplotlib ({e.name}): "
              "pip install 'lameduck[sim]'", file=sys.stderr)
        return 1
    return simulate_main(args)


ADMIN_ADDRESS_PATH_HELP = ("write the admin API's host:port to PATH once it is bound and "
                           "serving (Envoy's --admin-address-path; with admin.address on "
                           "port 0, the port the kernel gave)")


def _log_options(p: argparse.ArgumentParser, defaults: bool) -> None:
    """The global log options. They are on the main parser (with their defaults) and on every
    subcommand (``argparse.SUPPRESS``: only what is given there, which then wins), so they may
    come before or after the subcommand: ``lameduck --log-level debug run`` and ``lameduck
    run --log-level debug`` are the same."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    p.add_argument("--log-level", default=default("info"),
                   choices=["debug", "info", "warning", "error"],
                   help="the least severe level logged (default info)")
    p.add_argument("--log-format", default=default("text"), choices=["text", "json"],
                   help="text: '<ISO 8601 time> [pid] LEVEL logger: message' lines; json: one JSON "
                        "object per line with time, level, logger, message and pid, config "
                        "errors too (default text)")
    p.add_argument("--upstream-error-log-every", metavar="DURATION", type=_duration_arg,
                   default=default(DEFAULT_ERRLOG_INTERVAL),
                   help="at most one line per upstream endpoint and cause (connect failure, "
                        "reset, timeout) this often; the rest are counted in the next line "
                        "(default 10s; 0 logs each one)")


def admin_options(parser: argparse.ArgumentParser) -> Any:
    """How a command that talks to a running lameduck finds its admin API (one of them)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--admin", help="the admin API's host:port (default: from -c, else "
                                       "127.0.0.1:9901)")
    where.add_argument("-c", "--config", help="lameduck YAML config (for admin.address)")
    return where


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lameduck",
        description="A drain-aware HTTP proxy: take an instance out of a fleet without a "
                    "single failed request.")
    p.add_argument("--version", action=_Version, nargs=0,
                   help="the version, and whether the hot path is compiled, then exit")
    _log_options(p, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _log_options(common, defaults=False)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kw)

    run = add("run", help="run the proxy (no -c: the embedded default with a demo origin)")
    run.add_argument("-c", "--config", help="YAML config file")
    run.add_argument("--admin-address-path", metavar="PATH", help=ADMIN_ADDRESS_PATH_HELP)
    run.add_argument("--hot-restart", action="store_true",
                     help="take over the sockets of the lameduck running with the same config "
                          "path (at its hot-restart socket), which then drains and exits; "
                          "starts afresh if none runs. Without it, a lameduck already serving "
                          "the hot-restart socket or the admin address stops this one from "
                          "starting")
    run.add_argument("--log-file", metavar="PATH",
                     help="log to PATH (appended) instead of stderr; SIGUSR1 reopens it "
                          "(logrotate)")
    run.set_defaults(func=cmd_run)
    sup = add("supervise", help="run `lameduck run` as a child: SIGHUP hot-restarts "
                                           "it with the config, SIGTERM drains it, a dead child "
                                           "is restarted")
    sup.add_argument("-c", "--config", required=True, help="YAML config file")
    sup.add_argument("--admin-address-path", metavar="PATH",
                     help=ADMIN_ADDRESS_PATH_HELP + "; passed to every child, each writes it")
    sup.set_defaults(func=cmd_supervise)
    val = add("validate", help="check a config file and exit")
    val.add_argument("-c", "--config", help="YAML config file (default: the embedded one)")
    val.set_defaults(func=cmd_validate)
    bg = add("budget", help="check the timer chain of a pod, the config and the "
                                       "load balancer (grace, keep-alive, deadline, LB "
                                       "detection); --solve proposes values that fit")
    bg.add_argument("--pod", required=True, help="Kubernetes Pod or Deployment YAML")
    bg.add_argument("-c", "--config", help="lameduck YAML config (default: the embedded one)")
    bg.add_argument("--container", help="the container whose preStop counts (default: "
                                        "'lameduck', else the first with a preStop)")
    bg.add_argument("--prestop", type=_duration_arg,
                    help="how long the preStop hook runs (default: read from the hook)")
    bg.add_argument("--max-request", type=_duration_arg,
                    help="the longest request (default: the largest route timeout)")
    bg.add_argument("--exit-margin", type=_duration_arg, default=5.0,
                    help="slack between the shutdown deadline and SIGKILL (default 5s)")
    bg.add_argument("--lb", choices=list(LB_PRESETS),
                    help="the load balancer's documented defaults for the values below "
                         "(docs/budget.md, Balancer presets); flags override them")
    bg.add_argument("--lb-interval", type=_duration_arg,
                    help="LB health-check interval (default 2s, or the --lb preset's)")
    bg.add_argument("--lb-fall", type=_count_arg,
                    help="failed checks before the LB takes the instance out (default 3, or "
                         "the --lb preset's)")
    bg.add_argument("--lb-rise", type=_count_arg,
                    help="good checks before the LB puts an instance in (default 2, or the "
                         "--lb preset's)")
    bg.add_argument("--lb-deregistration-delay", type=_duration_arg,
                    help="how long the LB drains a deregistered pod (AWS target groups' "
                         "deregistration_delay.timeout_seconds; default: the --lb preset's, "
                         "else none): warned about when longer than the grace period")
    bg.add_argument("--lb-buffer", type=_duration_arg, default=5.0,
                    help="slack after the LB should have noticed (LB_BUFFER, "
                         "default 5s)")
    bg.add_argument("--lb-idle", type=_duration_arg, default=60.0,
                    help="the LB's idle timeout (default 60s)")
    bg.add_argument("--client-idle", type=_duration_arg, default=30.0,
                    help="the clients' keep-alive idle timeout (default 30s)")
    bg.add_argument("--solve", action="store_true",
                    help="print the smallest values that make every inequality hold")
    bg.add_argument("--json", action="store_true", help="machine-readable output")
    bg.set_defaults(func=cmd_budget)
    ps = add("prestop", help="the preStop hook: drain a running lameduck through its "
                                        "admin API with the health-check FSM and "
                                        "wait until the load balancer has taken it out")
    admin_options(ps)
    ps.add_argument("--strategy", choices=list(PRESTOP_STRATEGIES),
                    default="hold-health",
                    help="hold-health: drain, health 200 while requests are in flight, then "
                         "fail it and wait lb_buffer; deregister-first: fail health, wait "
                         "lb_buffer, then drain (default hold-health)")
    ps.add_argument("--drain-timeout", default="20s",
                    help="the longest the drain waits for requests in flight (default 20s)")
    ps.add_argument("--lb-buffer", default="10s",
                    help="the LB's detection time (interval x fall) plus a margin "
                         "(default 10s); with --leave confirm, the bound")
    ps.add_argument("--leave", choices=list(PRESTOP_LEAVES), default=PRESTOP_LEAVES[0],
                    help="when the health check's failing phase ends: timer: after "
                         "--lb-buffer; confirm: once every prober of the health-check path "
                         "has seen 'fall' failing answers and traffic has stopped, "
                         "--lb-buffer at the latest (default timer)")
    ps.set_defaults(func=cmd_prestop)
    tp = add("top", help="a live view of a running lameduck from its admin API: state, "
                         "drain progress, in-flight requests, closes per second, listeners "
                         "and cluster endpoints")
    admin_options(tp).add_argument(
        "--admin-address-path", metavar="PATH",
        help="read the admin API's host:port from PATH (the file `lameduck run "
             "--admin-address-path` writes)")
    tp.add_argument("--once", action="store_true",
                    help="print one plain-text snapshot and exit (also when stdout is not a "
                         "terminal)")
    tp.set_defaults(func=cmd_top)
    rp = add("report", help="draw a drain report (a drain.report_dir file or GET "
                            "/drain_report's answer) as a PNG")
    rp.add_argument("file", help="the report's JSON")
    rp.add_argument("--png", required=True, metavar="OUT", help="the PNG to write")
    rp.set_defaults(func=cmd_report)
    sm = add("simulate", help="simulate a rolling update or a drain of a whole fleet on the "
                              "drain core in virtual time: failures by cause, reconnects per "
                              "100 ms, per-instance load (docs/simulate.md)")
    sm.add_argument("scenario", nargs="+", help="scenario YAML (pod, config, lb, fleet, "
                                                "clients, rollout or drain)")
    sm.add_argument("--compare", action="store_true",
                    help="run every scenario given on the same random generator, side by side")
    sm.add_argument("--seed", type=int, help="the random generator's start (default: the "
                                             "scenario's seed key, else 1)")
    sm.add_argument("--json", metavar="OUT", help="the figures as JSON ('-': stdout)")
    sm.add_argument("--csv", metavar="OUT", help="the timelines per 100 ms as CSV")
    sm.add_argument("--instances-csv", metavar="OUT",
                    help="every instance's load at every sample as CSV (first scenario)")
    sm.add_argument("--png", metavar="OUT", help="reconnects, load and failures drawn")
    sm.add_argument("--solve", action="store_true",
                    help="the smallest drain.time and min_drain (and the grace period they "
                         "need) with no failed request and reconnects under --max-reconnects")
    sm.add_argument("--max-reconnects", type=_count_arg, default=1000, metavar="N",
                    help="for --solve: reconnects per 100 ms the fleet may reach "
                         "(default 1000)")
    sm.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="a progress bar on stderr (default: when stderr is a terminal)")
    sm.set_defaults(func=cmd_simulate)
    return p


def main(argv: list[str] | None = None) -> int:
    """A reader that goes away (``lameduck budget --json | head -1``) ends the output
    quietly: Python's docs on SIGPIPE point stdout at devnull so the flush at exit does not
    raise again, and the exit is 141, what a shell reports for a process SIGPIPE ended."""
    try:
        try:
            args = build_parser().parse_args(argv)
            handler: logging.Handler = logging.StreamHandler(sys.stderr)
            if getattr(args, "log_file", None):
                try:
                    handler = open_log_file(args.log_file)
                except OSError as e:
                    print(f"lameduck: --log-file {args.log_file}: {e}", file=sys.stderr)
                    return EXIT_LISTEN
            handler.setFormatter(log_formatter(args.log_format))
            logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                                handlers=[handler])
            set_errlog_interval(args.upstream_error_log_every)
            return int(args.func(args))
        finally:
            sys.stdout.flush()  # here, where a closed pipe can still be caught (also --help)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE
