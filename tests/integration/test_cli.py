"""The ``lameduck`` command: ``validate`` with exit codes and errors that name the
field, and ``run`` with no file serving the embedded default through its demo origin."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from lameduck import cli
from tests.procs import _env, base_config, port_in_use, stop, unique, wait_until

EXIT_CONFIG = 2
DEFAULT_PORTS = (10000, 9901, 8080)


def lameduck_cmd() -> list[str]:
    """The installed entry point when there is one (``.venv/bin/lameduck``), else -m."""
    exe = Path(sys.executable).with_name("lameduck")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "lameduck"]


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*lameduck_cmd(), *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(), check=False)


def write(tmp_path: Path, cfg: dict | str) -> Path:
    path = tmp_path / f"cfg-{unique()}.yaml"
    path.write_text(cfg if isinstance(cfg, str) else yaml.safe_dump(cfg))
    return path


def test_validate_good_config(tmp_path: Path) -> None:
    out = run_cli("validate", "-c", str(write(tmp_path, base_config(8080))))
    assert out.returncode == 0, out.stderr
    assert "OK (1 listeners, 1 clusters)" in out.stdout


def test_validate_embedded_default() -> None:
    out = run_cli("validate")
    assert out.returncode == 0, out.stderr
    assert "<embedded default>: OK" in out.stdout


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"drain": {"strategy": "sudden"}}, "drain.strategy", "gradual"),
    ({"drain": {"time": "soon"}}, "drain.time", "soon"),
    ({"shutdown": {"deadline": "1s"}}, "shutdown.deadline", "drain.time"),
    ({"shutdown": {"stop_accepting": "never"}}, "shutdown.stop_accepting", "never"),
    ({"listener": {"address": "127.0.0.1:99999"}}, "listeners[0].address", "port"),
    ({"route": {"cluster": "nope"}}, "listeners[0].routes[0].cluster", "unknown cluster"),
    ({"drain": {"tiem": "1s"}}, "drain.tiem", "unknown key"),
])
def test_validate_bad_config_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture,
                                             change: dict, field: str, words: str) -> None:
    """In-process (``cli.main``) to keep the table fast; the real process is checked below."""
    path = write(tmp_path, base_config(8080, **change))
    assert cli.main(["validate", "-c", str(path)]) == EXIT_CONFIG
    out, err = capsys.readouterr()
    assert f"{path}: {field}:" in err, err
    assert words in err
    assert out == ""


def test_validate_bad_config_as_a_process(tmp_path: Path) -> None:
    path = write(tmp_path, base_config(8080, drain={"strategy": "sudden"},
                                       shutdown={"deadline": "1s"}))
    out = run_cli("validate", "-c", str(path))
    assert out.returncode == EXIT_CONFIG, (out.stdout, out.stderr)
    # every problem, one line each, each naming its field
    assert f"{path}: drain.strategy:" in out.stderr
    assert "Traceback" not in out.stderr
    assert out.stdout == ""


def test_validate_unreadable_and_not_yaml(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["validate", "-c", str(tmp_path / "missing.yaml")]) == EXIT_CONFIG
    assert "cannot read" in capsys.readouterr().err
    assert cli.main(["validate", "-c", str(write(tmp_path, "admin: [unclosed\n"))]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "invalid YAML" in err and "line" in err


def test_run_with_a_bad_config_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, base_config(8080, drain={"strategy": "sudden"}))
    out = run_cli("run", "-c", str(path), timeout=30)
    assert out.returncode == EXIT_CONFIG
    assert "drain.strategy" in out.stderr


@pytest.mark.parametrize(("log", "field", "words"), [
    ({"path": "stdout", "format": "%RESPONSE_CODE_DETAILS%\n"}, "access_log.format",
     "unknown operator %RESPONSE_CODE_DETAILS%"),
    ({"path": "stdout", "format": "jsn"}, "access_log.format", "neither \"json\""),
    ({"path": "stdout", "format": "%START_TIME(%Q)%\n"}, "access_log.format",
     "unsupported specifier"),
    ({"path": "/nonexistent-dir/access.log"}, "access_log.path", "no directory"),
])
def test_validate_and_run_refuse_an_access_log_alike(tmp_path: Path, log: dict, field: str,
                                                      words: str) -> None:
    """What validate refuses, run refuses the same way (exit 2, the field named, no
    traceback), before it binds anything; tests/unit/test_accesslog_formats.py has every
    operator, in-process."""
    path = write(tmp_path, base_config(8080, listener={"access_log": log}))
    for command in ("validate", "run"):
        out = run_cli(command, "-c", str(path))
        assert out.returncode == EXIT_CONFIG, (command, out.stderr)
        assert f"{path}: listeners[0].{field}: " in out.stderr, (command, out.stderr)
        assert words in out.stderr
        assert "Traceback" not in out.stderr


def test_log_format_json_says_config_errors_as_json_records(tmp_path: Path) -> None:
    """A log shipper reading ``--log-format json`` gets a refused config as records too: one
    per problem, the field apart; validate and run alike."""
    path = write(tmp_path, base_config(8080, drain={"strategy": "sudden"},
                                       route={"cluster": "nope"}))
    for command in ("validate", "run"):
        out = run_cli("--log-format", "json", command, "-c", str(path))
        assert out.returncode == EXIT_CONFIG, out.stderr
        records = [json.loads(line) for line in out.stderr.splitlines()]
        # (run says its descriptor limit first, at INFO: records all the same)
        assert all(r["level"] == "INFO" for r in records[:-2]), records
        records = records[-2:]
        assert [r["field"] for r in records] == ["drain.strategy",
                                                 "listeners[0].routes[0].cluster"], records
        assert {(r["level"], r["logger"], r["source"]) for r in records} == {
            ("ERROR", "lameduck.config", str(path))}
        assert records[1]["message"] == f"{path}: {records[1]['field']}: {records[1]['problem']}"
        assert all(isinstance(r["pid"], int) and r["time"] for r in records)


def test_version(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("lameduck ")


@pytest.fixture
def default_ports() -> Iterator[None]:
    """The embedded default binds fixed ports (DEFAULT_PORTS): the tests that run it take
    this lock, so one runs at a time among every test process on the machine (the suite's
    parallel workers, or another checkout's run), whichever worker each lands on."""
    path = os.path.join(tempfile.gettempdir(), "lameduck-tests-default-ports.lock")
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


@pytest.mark.usefixtures("default_ports")
def test_run_embedded_default_serves_and_drains_on_sigterm(tmp_path: Path) -> None:
    busy = [p for p in DEFAULT_PORTS if port_in_use(p)]
    if busy:
        pytest.skip(f"the embedded default needs 127.0.0.1 ports {DEFAULT_PORTS}; in use: {busy}")
    errlog = tmp_path / "run.log"
    with errlog.open("wb") as err:
        proc = subprocess.Popen([*lameduck_cmd(), "run"], stdout=err, stderr=subprocess.STDOUT,
                                env=_env(), cwd=tmp_path)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"lameduck run exited early:\n{errlog.read_text()}")
            try:
                return httpx.get("http://127.0.0.1:9901/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(ready, 15, 0.05), errlog.read_text()
        r = httpx.get("http://127.0.0.1:10000/", timeout=5)
        assert r.status_code == 200
        assert r.text == "hello from the lameduck demo origin\n"
        r = subprocess.run(["curl", "-s", "--max-time", "5", "http://127.0.0.1:10000/sleep?ms=50"],
                           capture_output=True, text=True, check=False)
        assert r.stdout == "slept 50 ms\n"
        banner = errlog.read_text()
        assert "curl -X POST 'http://127.0.0.1:9901/drain_listeners?graceful&skip_exit'" in banner
        assert "http://127.0.0.1:10000/" in banner
        assert f"kill -TERM {proc.pid} (drains, then exits)" in banner  # the real pid

        def stat(name: str) -> int:
            body = httpx.get("http://127.0.0.1:9901/stats?format=json", timeout=2).json()
            return {s["name"]: s["value"] for s in body["stats"] if "name" in s}[name]

        assert stat("http.ingress.downstream_rq_2xx") == 2
        # No client connection left: SIGTERM makes it not ready, but it keeps accepting and
        # serving until the default 20 s drain time (clients that have not yet seen it leave
        # must not find a closed port), then exits 0.
        assert wait_until(lambda: stat("http.ingress.downstream_cx_active") == 0, 3)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        assert wait_until(
            lambda: httpx.get("http://127.0.0.1:9901/ready", timeout=1).status_code == 503, 3)
        assert httpx.get("http://127.0.0.1:10000/", timeout=5).status_code == 200
        assert proc.poll() is None
        assert proc.wait(timeout=30) == 0, errlog.read_text()
        assert 19 <= time.monotonic() - t0 < 27
        log = errlog.read_text()
        assert "drain started (shutdown)" in log
        assert "cut=0" in log
        assert "Traceback" not in log
        for p in DEFAULT_PORTS:
            assert wait_until(lambda p=p: not port_in_use(p), 3), f"port {p} still bound"
    finally:
        stop(proc)


def test_run_on_an_address_in_use_exits_1_without_a_traceback(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cfg = base_config(8080, listener={"address": f"127.0.0.1:{taken.getsockname()[1]}"})
        out = run_cli("run", "-c", str(write(tmp_path, cfg)))
    assert out.returncode == 1, out.stderr
    assert "cannot listen" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.usefixtures("default_ports")
def test_run_embedded_default_with_the_demo_port_taken(tmp_path: Path) -> None:
    busy = [p for p in DEFAULT_PORTS if port_in_use(p)]
    if busy:
        pytest.skip(f"the embedded default needs 127.0.0.1 ports {DEFAULT_PORTS}; in use: {busy}")
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", 8080))
        taken.listen()
        out = run_cli("run", timeout=30)
    assert out.returncode == 1, out.stderr
    assert "cannot start the demo origin on 127.0.0.1:8080" in out.stderr
    assert "Traceback" not in out.stderr


def test_admin_address_path_names_the_ephemeral_admin_port(tmp_path: Path,
                                                           origin_port: int) -> None:
    """Envoy's --admin-address-path: admin and listener on port 0; the file holds the admin's
    bound host:port once it serves, written whole (no temporary file left beside it), and
    /listeners there names the port the listener got, where it serves."""
    cfg = write(tmp_path, base_config(origin_port, admin={"address": "127.0.0.1:0"},
                                      listener={"address": "127.0.0.1:0"}))
    out = tmp_path / "admin.addr"
    errlog = tmp_path / "run.log"
    with errlog.open("wb") as err:
        proc = subprocess.Popen([*lameduck_cmd(), "run", "-c", str(cfg),
                                 "--admin-address-path", str(out)],
                                stdout=err, stderr=subprocess.STDOUT, env=_env())
    try:
        assert wait_until(lambda: out.exists() or proc.poll() is not None, 15, 0.02), \
            errlog.read_text()
        admin = out.read_text()
        assert admin.endswith("\n") and admin.startswith("127.0.0.1:"), admin
        admin = admin.strip()
        assert int(admin.rsplit(":", 1)[1]) > 0
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [cfg.name, "admin.addr", "run.log"])
        assert httpx.get(f"http://{admin}/ready", timeout=5).text == "LIVE\n"
        (line,) = httpx.get(f"http://{admin}/listeners", timeout=5).text.splitlines()
        name, _, addr = line.partition("::")
        assert name == "ingress" and addr.startswith("127.0.0.1:") and not addr.endswith(":0")
        assert httpx.get(f"http://{addr}/", timeout=5).status_code == 200
        # the banner shows the ports bound, not the configured 0
        assert wait_until(lambda: f"listener ingress: http://{addr}/" in errlog.read_text(), 5)
        assert f"admin: http://{admin}/" in errlog.read_text()
    finally:
        stop(proc)


def test_admin_address_path_that_cannot_be_written_fails_the_start(tmp_path: Path) -> None:
    cfg = write(tmp_path, base_config(8080))
    out = run_cli("run", "-c", str(cfg), "--admin-address-path", str(tmp_path / "no" / "addr"))
    assert out.returncode == 1, out.stderr
    assert "cannot write the admin address to" in out.stderr
    assert "Traceback" not in out.stderr
