"""``lameduck prestop``: start the preStop FSM in a running lameduck and follow it to CLOSED.

The FSM runs inside lameduck (``drain/prestop.py``, started by ``POST /prestop``), so it is
visible in ``/server_info`` and in stats and survives this command being killed; this side
only starts it, prints each transition as it happens and a JSON summary at the end, and turns
the outcome into an exit code a preStop hook or a runbook can act on.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

EXIT_CLEAN = 0  # drained: nothing was in flight when the health check went down
EXIT_BAD_ARGS = 2
EXIT_TIMED_OUT = 3  # drain_timeout passed with requests in flight (they may be cut later)
EXIT_UNREACHABLE = 4  # the admin API did not answer


class AdminUnreachable(Exception):
    pass


def _call(url: str, method: str, timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as e:
        raise ValueError(e.read().decode(errors="replace").strip() or str(e)) from None
    except (OSError, json.JSONDecodeError) as e:
        raise AdminUnreachable(f"{url}: {e}") from None


def live_line(view: dict[str, Any]) -> str:
    """One line of progress, redrawn in place on a terminal."""
    line = (f"prestop {view.get('strategy', '')}: {view.get('state', '?'):<8} "
            f"{view.get('elapsed', 0.0):7.1f}s  in flight {view.get('in_flight', 0)}")
    awaited = view.get("awaiting")
    if awaited:
        line += "  awaiting " + ", ".join(awaited)
    return line


def run_prestop(admin: str, strategy: str, drain_timeout: str, lb_buffer: str,
                say: Callable[[str], None], poll: float = 0.1,
                give_up: float | None = None,
                live: Callable[[str], None] | None = None,
                leave: str = "timer") -> tuple[int, dict[str, Any]]:
    """Start and follow; returns (exit code, summary). ``give_up``: seconds to follow at most
    (None: drain_timeout + lb_buffer + 30 s, read back from the server)."""
    base = f"http://{admin}"
    started = time.monotonic()
    query = (f"strategy={strategy}&drain_timeout={drain_timeout}&lb_buffer={lb_buffer}"
             f"&leave={leave}")
    try:
        view = _call(f"{base}/prestop?{query}", "POST", 5.0)
    except AdminUnreachable as e:
        say(f"prestop: admin API unreachable: {e}")
        return EXIT_UNREACHABLE, {"error": "admin unreachable", "detail": str(e)}
    except ValueError as e:
        say(f"prestop: refused: {e}")
        return EXIT_BAD_ARGS, {"error": "refused", "detail": str(e)}
    limit = give_up if give_up is not None else (
        view.get("drain_timeout", 0.0) + view.get("lb_buffer", 0.0) + 30.0)
    shown = 0
    misses = 0
    while True:
        for t in view.get("transitions", [])[shown:]:
            if live is not None:
                live("")
            say(f"prestop: {t['after']:7.3f}s {t['from']} -> {t['to']} ({t['reason']})")
        shown = len(view.get("transitions", []))
        if live is not None:
            live(live_line(view) if view.get("state") != "CLOSED" else "")
        if view.get("state") == "CLOSED":
            break
        if time.monotonic() - started > limit:
            say("prestop: gave up following (the FSM goes on in lameduck)")
            return EXIT_TIMED_OUT, {**view, "error": "not closed in time"}
        time.sleep(poll)
        try:
            view = _call(f"{base}/server_info", "GET", 5.0)["prestop"]
            misses = 0
        except AdminUnreachable as e:
            misses += 1
            if misses >= 10:  # ~1 s of silence: it has gone away
                say(f"prestop: admin API unreachable: {e}")
                return EXIT_UNREACHABLE, {**view, "error": "admin unreachable"}
    view["followed_for"] = round(time.monotonic() - started, 3)
    return (EXIT_TIMED_OUT if view.get("timed_out") else EXIT_CLEAN), view
