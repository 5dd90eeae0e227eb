"""What an operator meets at the edges, through the real ``lameduck`` process: one rule for
durations in flags and files, a port taken or two listeners that cannot both bind named as
such, a connection_grace that turns the proactive drain off said out loud, a closed pipe
that ends output quietly, and a second preStop with another strategy refused."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.procs import RawConn, _env, base_config, refused, refusing_port, unique, wait_until

EXIT_CONFIG = 2
EXIT_LISTEN = 1
EXIT_UNREACHABLE = 4  # lameduck prestop: the admin API did not answer


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lameduck", *args], capture_output=True,
                          text=True, timeout=timeout, env=_env(), check=False)


def write(tmp_path: Path, cfg: dict[str, Any]) -> str:
    path = tmp_path / f"cfg-{unique()}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


# -- durations: one rule for flags and files --------------------------------------------------


def test_durations_are_one_rule_for_flags_and_files(tmp_path: Path) -> None:
    """A plain number is seconds in a flag as in the file; a unitless number over an hour is
    refused in both, with the units to write."""
    admin = f"127.0.0.1:{refusing_port()}"
    # accepted: it gets as far as the admin API, which does not answer
    out = run_cli("prestop", "--admin", admin, "--drain-timeout", "10", "--lb-buffer", "0.5")
    assert out.returncode == EXIT_UNREACHABLE, out.stderr
    assert "invalid duration" not in out.stderr
    out = run_cli("prestop", "--admin", admin, "--drain-timeout", "20000")
    assert out.returncode == EXIT_CONFIG, out.stderr
    assert "implausible duration '20000'" in out.stderr
    assert "write 20000s if you mean it, or 20000ms" in out.stderr

    ok = write(tmp_path, base_config(8080, drain={"time": "5", "connection_grace": 0.5},
                                     shutdown={"deadline": 10}))
    out = run_cli("validate", "-c", ok)
    assert out.returncode == 0, out.stderr
    big = write(tmp_path, base_config(8080, drain={"time": 20000}))
    out = run_cli("validate", "-c", big)
    assert out.returncode == EXIT_CONFIG, out.stderr
    assert f"{big}: drain.time: implausible duration 20000" in out.stderr
    assert "write 20000s if you mean it, or 20000ms" in out.stderr
    hours = write(tmp_path, base_config(8080, drain={"time": "2h"},
                                        shutdown={"deadline": "2h", "min_drain": "0s"},
                                        hot_restart={"parent_shutdown_time": "2h"}))
    out = run_cli("validate", "-c", hours)
    assert out.returncode == 0, out.stderr


# -- listening: the listener, the address and the cause -----------------------------------------


def test_a_port_taken_names_the_listener_the_address_and_the_cause(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = base_config(8080, listener={"address": f"127.0.0.1:{port}"})
        out = run_cli("run", "-c", write(tmp_path, cfg))
    assert out.returncode == EXIT_LISTEN, out.stderr
    assert (f"cannot listen: listener 'ingress' on 127.0.0.1:{port}: address already in use"
            in out.stderr), out.stderr
    assert "Errno" not in out.stderr and "Traceback" not in out.stderr


def test_an_admin_port_taken_by_another_program_names_the_admin_address(
        tmp_path: Path) -> None:
    """Not another lameduck (that one is named by its pid): a plain socket holds the port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = base_config(8080, listener={"address": "127.0.0.1:0"})
        cfg["admin"] = {"address": f"127.0.0.1:{port}"}
        out = run_cli("run", "-c", write(tmp_path, cfg))
    assert out.returncode == EXIT_LISTEN, out.stderr
    assert f"cannot listen: admin on 127.0.0.1:{port}: address already in use" in out.stderr, (
        out.stderr)
    assert "Errno" not in out.stderr and "Traceback" not in out.stderr


def test_validate_refuses_listeners_that_cannot_both_bind(tmp_path: Path) -> None:
    """0.0.0.0:P beside 127.0.0.1:P passes no bind on Linux: validate says so first."""
    cfg = base_config(8080, listener={"address": "0.0.0.0:18080"})
    second = {**cfg["listeners"][0], "name": "local", "address": "127.0.0.1:18080"}
    cfg["listeners"].append(second)
    path = write(tmp_path, cfg)
    out = run_cli("validate", "-c", path)
    assert out.returncode == EXIT_CONFIG, (out.stdout, out.stderr)
    assert (f"{path}: listeners[1].address: 127.0.0.1:18080 cannot be bound beside listener "
            "'ingress' (listeners[0].address) on 0.0.0.0:18080" in out.stderr), out.stderr


# -- connection_grace >= T/3: valid, said out loud ----------------------------------------------


def test_validate_warns_that_a_long_grace_turns_the_proactive_drain_off(tmp_path: Path) -> None:
    path = write(tmp_path, base_config(8080, drain={"time": "900ms", "connection_grace": "300ms"}))
    out = run_cli("validate", "-c", path)
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout
    assert (f"WARNING lameduck.config: {path}: drain.connection_grace: 300ms is >= "
            "drain.time/3 (900ms/3)" in out.stderr), out.stderr
    assert "keep connection_grace below 300ms or drain.time above 900ms" in out.stderr
    # (no min_drain below drain.time either: that has a warning of its own)
    cfg = base_config(8080, drain={"time": "1s", "connection_grace": "200ms"})
    del cfg["shutdown"]["min_drain"]
    quiet = write(tmp_path, cfg)
    out = run_cli("validate", "-c", quiet)
    assert out.returncode == 0 and "WARNING" not in out.stderr, out.stderr


# -- a reader that goes away ------------------------------------------------------------------


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app"},
       "spec": {"terminationGracePeriodSeconds": 60, "containers": [
           {"name": "lameduck", "image": "lameduck",
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}}]}}


@pytest.mark.parametrize("args", [
    ("budget", "--pod", "{pod}", "--json"),
    ("budget", "--pod", "{pod}", "--solve"),
    ("validate",),
    ("prestop", "--admin", "{refusing}", "--drain-timeout", "1s", "--lb-buffer", "0s"),
])  # fmt: skip
def test_output_to_a_closed_pipe_ends_quietly(tmp_path: Path, args: tuple[str, ...]) -> None:
    """``lameduck budget --json | head -1``: the reader is gone before the output is
    written (its end of the pipe is closed first, so every write fails, not only a late one)."""
    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump(POD))
    argv = [a.format(pod=pod, refusing=f"127.0.0.1:{refusing_port()}") for a in args]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run([sys.executable, "-m", "lameduck", *argv], stdout=write_end,
                             stderr=subprocess.PIPE, text=True, timeout=30, env=_env(),
                             check=False)
    finally:
        os.close(write_end)
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    assert out.returncode == 141, out.stderr  # 128 + SIGPIPE, as a shell reports it


# -- a second preStop -------------------------------------------------------------------------


def test_a_second_prestop_with_another_strategy_is_a_conflict(lameduck) -> None:
    ld = lameduck()
    first = ld.admin("POST", "/prestop?strategy=hold-health&drain_timeout=10s&lb_buffer=30s")
    assert first.status_code == 200, first.text
    assert first.json()["strategy"] == "hold-health"

    other = ld.admin("POST", "/prestop?strategy=deregister-first&drain_timeout=1s&lb_buffer=0s")
    assert other.status_code == 409, other.text
    assert other.reason_phrase == "Conflict"
    assert other.text.startswith("a preStop with strategy hold-health is already running "
                                 "(state "), other.text
    out = run_cli("prestop", "--admin", ld.admin_addr, "--strategy", "deregister-first")
    assert out.returncode == EXIT_CONFIG, (out.stdout, out.stderr)
    assert "strategy hold-health is already running" in out.stderr, out.stderr

    same = ld.admin("POST", "/prestop?strategy=hold-health&drain_timeout=1s&lb_buffer=0s")
    assert same.status_code == 200, same.text
    view = same.json()
    assert view["strategy"] == "hold-health"
    assert (view["drain_timeout"], view["lb_buffer"]) == (10.0, 30.0), view  # the running one's
    assert view["transitions"][0] == first.json()["transitions"][0]
    assert ld.server_info()["prestop"]["strategy"] == "hold-health"


# -- from T on: new connections refused, open ones answered "going away" ---------------------


def test_after_t_a_new_client_is_refused_and_an_open_connection_gets_going_away(
        lameduck) -> None:
    """What README and docs/drain.md promise: at T the listener stops accepting (a new
    client's connect is refused, nothing answers it), while a request on a connection opened
    before gets 503 going away."""
    ld = lameduck(drain={"time": "0s", "strategy": "immediate", "connection_grace": "0s"},
                  shutdown={"deadline": "30s", "stop_accepting": "at_drain_end"})
    idle = RawConn(ld.addr)
    assert idle.request("/").status == 200
    busy = RawConn(ld.addr, 30)  # keeps the process alive past T (seconds: a loaded machine)
    busy.send("/sleep?ms=8000")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1)
    t0 = time.monotonic()
    ld.signal(signal.SIGTERM)
    assert wait_until(lambda: refused(ld.addr), 7), "the listener still accepts after T"
    gone = idle.request("/")
    assert time.monotonic() - t0 < 7.5, "too slow: the busy request may have ended the process"
    assert (gone.status, gone.body, gone.closes) == (503, b"going away\n", True)
    assert gone.header("retry-after") is not None
    assert busy.read_response().status == 200
    assert ld.wait(30) == 0
