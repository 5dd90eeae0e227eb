"""A plain second `lameduck run` never takes a running one's sockets: where another lameduck
serves its hot-restart socket or its admin address, it refuses to start, naming that one's pid
and config path, and the first keeps serving untouched. Taking over is asked for: SIGHUP,
`lameduck supervise`, or `lameduck run --hot-restart` with the same config path."""

from __future__ import annotations

import copy
import signal
from pathlib import Path

import httpx

from tests.procs import Lameduck, base_config


def _fails(ld: Lameduck, args: tuple[str, ...] = ()) -> int:
    """Start ``ld``, which must exit before it serves; its exit code."""
    try:
        ld.start(args=args)
    except RuntimeError as e:
        assert "exited early" in str(e)
    return ld.wait(10)


def _untouched(first: Lameduck) -> None:
    """The first one still serves, as epoch 0, and no handover started in it."""
    assert first.proc is not None and first.proc.poll() is None
    for _ in range(5):
        assert httpx.get(first.url("/"), timeout=5).status_code == 200
    info = first.server_info()
    assert info["state"] == "LIVE" and info["hot_restart_epoch"] == 0
    assert "hot restart" not in first.log(), first.log()


def _other(origin_port: int) -> dict:
    """Another service: its own listener name (and port)."""
    return base_config(origin_port, listener={"name": "other"})


def test_a_second_run_on_the_same_hot_restart_socket_is_refused(
        origin_port: int, tmp_path: Path) -> None:
    first = Lameduck(base_config(origin_port), tmp_path).start()
    cfg = _other(origin_port)
    cfg["hot_restart"] = copy.deepcopy(first.cfg["hot_restart"])
    second = Lameduck(cfg, tmp_path)
    assert _fails(second) == 1
    out = second.log()
    assert f"lameduck pid {first.pid} (config {first.path})" in out, out
    assert f"hot-restart socket {first.cfg['hot_restart']['socket']}" in out, out
    assert "--hot-restart" in out and "SIGHUP" in out
    _untouched(first)


def test_a_second_run_on_the_same_admin_port_is_refused(origin_port: int,
                                                         tmp_path: Path) -> None:
    """Admin port taken, hot-restart sockets apart: the admin API names the running one."""
    first = Lameduck(base_config(origin_port), tmp_path).start()
    second = Lameduck(dict(_other(origin_port), admin={"address": first.admin_addr}), tmp_path)
    assert second.cfg["hot_restart"]["socket"] != first.cfg["hot_restart"]["socket"]
    assert _fails(second) == 1
    out = second.log()
    assert f"lameduck pid {first.pid} (config {first.path}) already serves the admin " \
           f"address {first.admin_addr}" in out, out
    _untouched(first)


def test_hot_restart_with_another_config_path_is_refused(origin_port: int,
                                                         tmp_path: Path) -> None:
    first = Lameduck(base_config(origin_port), tmp_path).start()
    cfg = _other(origin_port)
    cfg["hot_restart"] = copy.deepcopy(first.cfg["hot_restart"])
    second = Lameduck(cfg, tmp_path)
    assert _fails(second, ("--hot-restart",)) == 1
    out = second.log()
    assert f"pid {first.pid} serves config {first.path}, not {second.path}" in out, out
    assert "the same config path" in out
    assert "refused a new process" in first.log()
    assert first.proc is not None and first.proc.poll() is None
    assert httpx.get(first.url("/"), timeout=5).status_code == 200
    assert first.server_info()["hot_restart_epoch"] == 0


def test_a_stale_hot_restart_socket_does_not_stop_a_start(origin_port: int,
                                                          tmp_path: Path) -> None:
    """A process SIGKILLed leaves its socket file; nobody answers there: start as usual."""
    first = Lameduck(base_config(origin_port), tmp_path).start()
    first.signal(signal.SIGKILL)
    first.wait(10)
    assert Path(first.cfg["hot_restart"]["socket"]).exists()
    cfg = _other(origin_port)
    cfg["hot_restart"] = copy.deepcopy(first.cfg["hot_restart"])
    second = Lameduck(cfg, tmp_path).start()
    assert httpx.get(second.url("/"), timeout=5).status_code == 200
    assert second.server_info()["hot_restart_epoch"] == 0
    second.kill()


def test_hot_restart_with_nobody_running_starts_afresh(origin_port: int, tmp_path: Path) -> None:
    ld = Lameduck(base_config(origin_port), tmp_path).start(args=("--hot-restart",))
    assert "no lameduck serves" in ld.log() and "starting afresh" in ld.log()
    assert ld.server_info()["hot_restart_epoch"] == 0
    ld.kill()
