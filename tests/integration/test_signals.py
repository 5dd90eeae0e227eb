"""`lameduck run` and each signal, with a request in flight to a slow origin endpoint (the
table in README.md, "Signals"): the request completes or the documented action happens, a
log line says what happened, and no signal ends the process by its default action."""

from __future__ import annotations

import contextlib
import re
import signal
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.procs import Lameduck, RawConn, wait_until

pytestmark = pytest.mark.usefixtures("workers")


def _in_flight(ld: Lameduck, ms: int = 4000) -> RawConn:
    """A request the origin answers after ``ms``, once lameduck counts it active (with
    workers, as their reports reach the main process: seconds, so that a loaded machine
    still sees it in flight)."""
    c = RawConn(ld.addr, timeout=30)
    c.send(f"/sleep?ms={ms}")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1, 15)
    return c


def _logged(ld: Lameduck, text: str, path: Path | None = None) -> bool:
    """``text`` is in the process's log (its output, or the ``--log-file`` at ``path``)."""
    if path is None:
        return text in ld.log()
    with contextlib.suppress(FileNotFoundError):
        return text in path.read_text(errors="replace")
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT, signal.SIGINT])
def test_a_stop_signal_drains_and_exits(lameduck, sig: signal.Signals) -> None:
    ld = lameduck()
    c = _in_flight(ld)
    ld.signal(sig)
    assert wait_until(lambda: _logged(ld, f"{sig.name}"), 5), ld.log()
    r = c.read_response()
    assert r.status == 200 and r.complete
    assert ld.wait(10) == 0, ld.log()  # the drain's code, not -SIG (the default action)
    log = ld.log()
    assert re.search(rf"drain started \(shutdown\).*{sig.name}.*: drain, then exit", log), log
    assert "drain complete: no request in flight" in log


def test_a_second_sigint_exits_at_once(lameduck) -> None:
    """Without the second SIGINT the drain would cut the request at shutdown.deadline, 30 s
    after the first: an exit within a third of that is the second SIGINT's, however loaded
    the machine (the old 4 s deadline left 2 s, which a loaded machine outlived)."""
    ld = lameduck(shutdown={"deadline": "30s"}, route={"timeout": "120s"})
    c = _in_flight(ld, ms=90_000)  # in flight past the deadline: only a cut ends it
    ld.signal(signal.SIGINT)
    assert wait_until(lambda: _logged(ld, "a second SIGINT exits at once"), 5), ld.log()
    assert ld.proc is not None and ld.proc.poll() is None
    t0 = time.monotonic()
    ld.signal(signal.SIGINT)
    assert ld.wait(30) == 3, ld.log()  # a request was cut
    assert time.monotonic() - t0 < 10.0, ld.log()  # the deadline is >= 25 s after t0
    with contextlib.suppress(ConnectionError):
        assert c.read_response().status == 503  # cut before the response (or a reset)
    log = ld.log()
    assert "second SIGINT: quit requested: exiting at once" in log, log
    assert "second SIGINT: cutting 1 requests still in flight" in log, log


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2])
def test_usr_signals_keep_serving(lameduck, sig: signal.Signals) -> None:
    """SIGUSR1 without --log-file has nothing to reopen; SIGUSR2 is ignored; both logged."""
    ld = lameduck()
    c = _in_flight(ld)
    ld.signal(sig)
    said = ("SIGUSR1: no --log-file" if sig is signal.SIGUSR1
            else "SIGUSR2: ignored")
    assert wait_until(lambda: _logged(ld, said), 5), ld.log()
    r = c.read_response()
    assert r.status == 200 and r.complete
    assert ld.proc is not None and ld.proc.poll() is None
    assert httpx.get(ld.url("/"), timeout=5).status_code == 200
    assert ld.server_info()["state"] == "LIVE"


def test_sigusr1_reopens_the_log_file(origin_port: int, tmp_path: Path) -> None:
    """logrotate's way: the file is renamed, then SIGUSR1; the log goes on in a new file at the
    same path, and nothing more into the renamed one."""
    from tests.procs import base_config

    logfile = tmp_path / "lameduck.log"
    ld = Lameduck(base_config(origin_port), tmp_path).start(args=("--log-file", str(logfile)))
    try:
        assert _logged(ld, "listener ingress on", logfile)
        assert "listener ingress on" not in ld.log()  # stderr has the banner only
        c = _in_flight(ld)
        rotated = logfile.rename(tmp_path / "lameduck.log.1")
        ld.signal(signal.SIGUSR1)
        assert wait_until(lambda: _logged(ld, f"SIGUSR1: reopened the log file {logfile}",
                                          logfile), 5), ld.log()
        r = c.read_response()
        assert r.status == 200 and r.complete
        size = rotated.stat().st_size
        ld.signal(signal.SIGUSR2)
        assert wait_until(lambda: _logged(ld, "SIGUSR2: ignored", logfile), 5)
        assert rotated.stat().st_size == size
        assert ld.proc is not None and ld.proc.poll() is None
    finally:
        ld.kill()


def test_sighup_hot_restarts_with_the_config_reread(lameduck, subreaper: list[int]) -> None:
    ld = lameduck()
    c = _in_flight(ld)
    port = ld.port
    cfg = dict(ld.cfg, drain=dict(ld.cfg["drain"], time="3s"))
    ld.path.write_text(yaml.safe_dump(cfg))  # the config re-read: a drain time of 3s
    ld.signal(signal.SIGHUP)
    found: list[int] = []

    def started() -> bool:
        m = re.search(r"SIGHUP: hot restart: started pid (\d+)", ld.log())
        if m:
            found.append(int(m.group(1)))
        return m is not None

    assert wait_until(started, 5), ld.log()
    subreaper.append(found[0])
    assert wait_until(lambda: ld.reread() and ld.server_info()["pid"] == found[0], 15), ld.log()
    info = ld.server_info()
    assert info["hot_restart_epoch"] == 1
    assert info["command_line_options"]["drain_time"] == "3s"
    assert info["command_line_options"]["config_path"] == str(ld.path)
    r = c.read_response()  # the old process finishes what it had
    assert r.status == 200 and r.complete
    assert ld.wait(10) == 0, ld.log()
    assert ld.port == port  # the socket was handed over, not bound anew
    assert httpx.get(ld.url("/"), timeout=5).status_code == 200
    log = ld.log()
    assert f"hot restart: took the sockets of pid {ld.pid}" in log, log


def test_sighup_with_a_broken_config_changes_nothing(lameduck) -> None:
    ld = lameduck()
    c = _in_flight(ld)
    good = ld.path.read_text()
    ld.path.write_text(good.replace("time: 2s", "time: banana"))
    ld.signal(signal.SIGHUP)
    assert wait_until(lambda: _logged(ld, "SIGHUP: config not valid, nothing changed"), 5)
    assert "drain.time" in ld.log()
    r = c.read_response()
    assert r.status == 200 and r.complete
    assert ld.proc is not None and ld.proc.poll() is None
    assert ld.server_info()["hot_restart_epoch"] == 0
