"""systemd: Type=notify readiness and socket activation, with this test standing in for
systemd (tests/sdactivate.py passes sockets exactly as sd_listen_fds(3) describes; a Unix
datagram socket receives the sd_notify states)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.procs import Lameduck, base_config, refusing_port, unique

SDACTIVATE = [sys.executable, str(Path(__file__).resolve().parents[1] / "sdactivate.py")]


def _listening(port: int = 0) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(128)
    return s


def _get(port: int, path: str = "/") -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)


def test_socket_passed_by_name_is_served_and_no_connection_is_refused(
        origin_port: int, tmp_path: Path) -> None:
    """The socket named after the listener (FileDescriptorName=ingress) is the one served,
    whatever address the config names; a connection made before lameduck runs is queued by
    the kernel and answered. The configured address is one this test holds bound: had
    lameduck tried to bind it, it would have failed to start."""
    passed = _listening()
    port = passed.getsockname()[1]
    early = socket.create_connection(("127.0.0.1", port), timeout=10)
    early.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    configured = f"127.0.0.1:{refusing_port()}"
    ld = Lameduck(base_config(origin_port, listener={"address": configured}), tmp_path)
    fd = passed.fileno()
    try:
        ld.start(wrapper=[*SDACTIVATE, f"{fd}=ingress", "--"], pass_fds=(fd,))
        passed.close()  # lameduck holds its own copy
        data = b""
        while chunk := early.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
        assert _get(port).status_code == 200
        assert ld.port == port  # /listeners: the passed socket's port
        # The configured address was not bound: this test holds it (``refusing_port``), so a
        # bind there would have failed the start.
        assert "takes the socket passed by systemd" in ld.log()
    finally:
        early.close()
        ld.kill()


def test_socket_matched_by_address(origin_port: int, tmp_path: Path) -> None:
    """Without a name, the socket bound to a listener's address is that listener's: lameduck
    does not try to bind it again (which would fail: the harness holds it)."""
    passed = _listening()
    cfg = base_config(origin_port,
                      listener={"address": f"127.0.0.1:{passed.getsockname()[1]}"})
    ld = Lameduck(cfg, tmp_path)
    fd = passed.fileno()
    try:
        ld.start(wrapper=[*SDACTIVATE, str(fd), "--"], pass_fds=(fd,))
        passed.close()
        assert _get(ld.port).status_code == 200
    finally:
        ld.kill()


def test_sockets_for_another_pid_are_ignored(origin_port: int, tmp_path: Path) -> None:
    """LISTEN_PID names another process: the sockets are not ours; lameduck binds its own."""
    passed = _listening()
    ld = Lameduck(base_config(origin_port), tmp_path)
    fd = passed.fileno()
    try:
        ld.start(wrapper=[*SDACTIVATE, "--pid-offset", "7", f"{fd}=ingress", "--"],
                 pass_fds=(fd,))
        assert _get(ld.port).status_code == 200
        assert "passed by systemd" not in ld.log()
    finally:
        passed.close()
        ld.kill()


def test_a_passed_descriptor_that_is_not_a_listening_socket_is_refused(
        origin_port: int, tmp_path: Path) -> None:
    """A bad handover is an operator error with a clear message, not a traceback."""
    r, w = os.pipe()
    ld = Lameduck(base_config(origin_port), tmp_path)
    try:
        with pytest.raises(RuntimeError, match="exited early"):
            ld.start(wrapper=[*SDACTIVATE, f"{r}=ingress", "--"], pass_fds=(r,))
        assert ld.wait(5) == 1
        assert "socket activation: LISTEN_FDS=1: fd 3 is not a socket" in ld.log()
        assert "Traceback" not in ld.log()
    finally:
        os.close(r)
        os.close(w)
        ld.kill()


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_notify_ready_then_stopping(origin_port: int, tmp_path: Path, abstract: bool) -> None:
    """READY=1 once it serves (MAINPID its own pid), STOPPING=1 when SIGTERM starts the drain;
    NOTIFY_SOCKET is a path, or @name in the abstract namespace."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"@lameduck-test-{unique()}"
        sock.bind("\0" + name[1:])
    else:
        name = str(tmp_path / "notify.sock")
        sock.bind(name)
    sock.settimeout(10)
    ld = Lameduck(base_config(origin_port), tmp_path)
    try:
        ld.start(env={"NOTIFY_SOCKET": name})
        ready = sock.recv(4096).decode().split("\n")
        assert "READY=1" in ready
        assert f"MAINPID={ld.pid}" in ready
        assert _get(ld.port).status_code == 200
        t0 = time.monotonic()
        ld.signal(signal.SIGTERM)
        stopping = sock.recv(4096).decode().split("\n")
        assert "STOPPING=1" in stopping
        assert time.monotonic() - t0 < 2  # at the start of the drain, not at its end
        assert ld.wait(10) == 0
    finally:
        sock.close()
        ld.kill()


SANDBOX = [sys.executable, str(Path(__file__).resolve().parents[1] / "sandbox.py"), "--"]


def _sandbox_or_skip() -> None:
    import subprocess

    ok = subprocess.run([*SANDBOX, "true"], capture_output=True, text=True, check=False)
    if ok.returncode == 77:
        pytest.skip(ok.stderr.strip())
    assert ok.returncode == 0, ok.stderr


def _wait_pid(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_the_units_syscall_filter_and_memory_rule_hold_for_run(
        origin_port: int, tmp_path: Path) -> None:
    """lameduck.service's SystemCallFilter=@system-service ~@privileged (EPERM) and
    MemoryDenyWriteExecute=yes, enforced by the kernel (tests/sandbox.py): lameduck run
    (CPython, uvloop, httptools, RE2, the mypyc-compiled modules) serves HTTP/1.1 and HTTP/2,
    answers /stats?filter= (RE2), raises its descriptor limit, hot-restarts on SIGHUP (the
    successor exec'd under the same rules) and drains out on SIGTERM with exit 0."""
    _sandbox_or_skip()
    ld = Lameduck(base_config(origin_port), tmp_path).start(wrapper=SANDBOX)
    successor = None
    try:
        assert _get(ld.port).status_code == 200
        with httpx.Client(http2=True, http1=False, timeout=5) as c:
            assert c.get(ld.url("/")).http_version == "HTTP/2"
        assert ld.admin("GET", "/stats?filter=^server\\.").status_code == 200
        ld.signal(signal.SIGHUP)
        end = time.monotonic() + 15
        while time.monotonic() < end and successor is None:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                pid = ld.server_info()["pid"]
                successor = pid if pid != ld.pid else None
            time.sleep(0.05)
        assert successor is not None, ld.log()
        assert _get(ld.port).status_code == 200
        assert ld.stat("server.hot_restart_epoch") == 1
        assert ld.wait(30) == 0, ld.log()  # the old process drained out
        os.kill(successor, signal.SIGTERM)
        assert _wait_pid(successor, 30), ld.log()
    finally:
        log = ld.log()
        if successor is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(successor, signal.SIGKILL)
        ld.kill()
    assert "Operation not permitted" not in log and "Permission denied" not in log, log
    assert "Traceback" not in log and "cannot raise the soft limit" not in log, log


@pytest.mark.parametrize("command", ["workers", "supervise"])
def test_the_units_syscall_filter_and_memory_rule_hold_for(
        command: str, origin_port: int, tmp_path: Path) -> None:
    """The same rules over `workers: 2` (a pool of processes) and `lameduck supervise` (held
    sockets, sd_notify, /proc/PID/status): serve, reload where there is one, exit 0."""
    _sandbox_or_skip()
    cfg = base_config(origin_port)
    if command == "workers":
        cfg["workers"] = 2
    ld = Lameduck(cfg, tmp_path).start(
        wrapper=SANDBOX, command="supervise" if command == "supervise" else "run")
    try:
        for _ in range(4):
            assert _get(ld.port).status_code == 200
        if command == "supervise":
            ld.signal(signal.SIGHUP)
            end = time.monotonic() + 15
            while time.monotonic() < end and "SIGHUP: child" not in ld.log():
                time.sleep(0.05)
            assert "serves; child" in ld.log(), ld.log()
            assert _get(ld.port).status_code == 200
        ld.signal(signal.SIGTERM)
        assert ld.wait(30) == 0, ld.log()
    finally:
        log = ld.log()
        ld.kill()
    assert "Operation not permitted" not in log and "Permission denied" not in log, log
    assert "Traceback" not in log, log
