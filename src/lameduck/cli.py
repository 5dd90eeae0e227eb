"""The ``lameduck`` command: one function per subcommand, thin; the work is in server.py."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from lameduck import __version__
from lameduck.config import Config, ConfigError, default_config, load_config
from lameduck.restart import Notifier, listen_fds, match_listeners
from lameduck.restart.hot import connect_parent, default_path

EXIT_CONFIG = 2
EXIT_LISTEN = 1  # an address could not be bound


def _run_loop(main: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """uvloop when present: it is most of the speed of the I/O shell."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


def _load(path: str | None) -> Config:
    return default_config() if path is None else load_config(path)


def _banner(cfg: Config, demo: bool) -> str:
    admin = cfg.admin.address
    lines = ["", "lameduck is running" + (" on its embedded default config" if demo else "")]
    for ls in cfg.listeners:
        base = f"http://{ls.address}"
        lines.append(f"  listener {ls.name}: {base}/")
        if demo:
            lines.append(f"    try:  curl -i {base}/   |   curl -i '{base}/sleep?ms=3000'"
                         f"   |   curl -N {base}/stream")
        if ls.health_check_path:
            lines.append(f"    health check: {base}{ls.health_check_path}")
    lines += [
        f"  admin: http://{admin}/   (stats: http://{admin}/stats, ready: http://{admin}/ready)",
        "  start a graceful drain:",
        f"    curl -X POST 'http://{admin}/drain_listeners?graceful&skip_exit'",
        "  or stop it the way Kubernetes does: kill -TERM <pid> (drains, then exits)",
        "",
    ]
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    try:
        cfg = _load(args.config)
    except ConfigError as e:
        print(f"lameduck: invalid config\n{e}", file=sys.stderr)
        return EXIT_CONFIG
    demo = args.config is None
    try:
        sockets = match_listeners(cfg.listeners, listen_fds())
    except ValueError as e:
        print(f"lameduck: socket activation: {e}", file=sys.stderr)
        return EXIT_LISTEN

    async def main() -> int:
        from lameduck.demo.origin import serve as serve_origin
        from lameduck.demo.origin import shutdown as shutdown_origin
        from lameduck.server import Server

        origin = None
        if demo:
            ep = cfg.clusters[0].endpoints[0].address
            try:
                origin = await serve_origin(ep.host, ep.port)
            except OSError as e:
                # A port already taken is an operator's problem, not a traceback.
                print(f"lameduck: cannot start the demo origin on {ep}: {e}", file=sys.stderr)
                return EXIT_LISTEN
            logging.getLogger("lameduck").info("demo origin on %s", ep)
        inherited = None
        restart_path = None
        if not demo:  # the demo origin lives in this process: it cannot be handed over
            a = cfg.admin.address
            restart_path = cfg.hot_restart.socket or default_path(a.host, a.port)
            try:
                inherited = connect_parent(restart_path) if restart_path else None
            except (OSError, ValueError) as e:
                print(f"lameduck: hot restart from {restart_path} failed: {e}", file=sys.stderr)
                return EXIT_LISTEN
            if inherited is not None:
                logging.getLogger("lameduck").info(
                    "hot restart: took the sockets of pid %d (epoch %d)",
                    inherited.parent_pid, inherited.epoch)
        server = Server(cfg, sockets=sockets, notifier=Notifier(), inherited=inherited,
                        restart_path=restart_path)
        # A stop asked for while starting (a supervisor's SIGTERM during a hot restart) waits
        # for the start to finish, then drains; the default action would kill the process
        # with connections it had accepted on sockets it shares with the old one.
        early: list[str] = []
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, early.append, sig.name)
        try:
            await server.start()
        except OSError as e:
            print(f"lameduck: cannot listen: {e}", file=sys.stderr)
            if origin is not None:
                await shutdown_origin(origin, grace=0.0)
            return EXIT_LISTEN
        server.install_signal_handlers()
        if early:
            server.begin_shutdown(early[0])
        print(_banner(cfg, demo), file=sys.stderr, flush=True)
        code = await server.done
        if origin is not None:
            await shutdown_origin(origin, grace=0.2)
        return code

    return _run_loop(main)


def cmd_supervise(args: argparse.Namespace) -> int:
    try:
        load_config(args.config)
    except ConfigError as e:
        print(f"lameduck: invalid config\n{e}", file=sys.stderr)
        return EXIT_CONFIG
    if os.environ.get("LISTEN_PID") == str(os.getpid()):
        # Its children could not use them (LISTEN_PID names the supervisor), and nobody would
        # accept on them: refuse rather than queue connections nobody serves.
        print("lameduck: supervise does not take sockets from systemd socket activation; "
              "use `lameduck run` with a .socket unit, or supervise without one",
              file=sys.stderr)
        return EXIT_LISTEN
    from lameduck.restart.supervisor import supervise

    return _run_loop(lambda: supervise(args.config, args.log_level))


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        cfg = _load(args.config)
    except ConfigError as e:
        print(f"{e}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{args.config or '<embedded default>'}: OK ({len(cfg.listeners)} listeners, "
          f"{len(cfg.clusters)} clusters)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lameduck",
        description="A drain-aware HTTP proxy: take an instance out of a fleet without a "
                    "single failed request.")
    p.add_argument("--version", action="version", version=f"lameduck {__version__}")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the proxy (no -c: the embedded default with a demo "
                                     "origin)")
    run.add_argument("-c", "--config", help="YAML config file")
    run.set_defaults(func=cmd_run)
    sup = sub.add_parser("supervise", help="run `lameduck run` as a child: SIGHUP hot-restarts "
                                           "it with the config, SIGTERM drains it, a dead child "
                                           "is restarted")
    sup.add_argument("-c", "--config", required=True, help="YAML config file")
    sup.set_defaults(func=cmd_supervise)
    val = sub.add_parser("validate", help="check a config file and exit")
    val.add_argument("-c", "--config", help="YAML config file (default: the embedded one)")
    val.set_defaults(func=cmd_validate)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S", stream=sys.stderr)
    return int(args.func(args))
