"""Real processes for the tests: the demo origin and lameduck itself, started and stopped by
pid. No mocks: the tests talk to these over real sockets. Every server binds port 0 and the
test reads the port it got back (never "find a free port, close it, let a process bind it":
tests run in parallel, and another one could take that port in between)."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import re
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

SRC = Path(__file__).resolve().parents[1] / "src"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    env.pop("NOTIFY_SOCKET", None)
    return env


ROOT = SRC.parent
_installed: set[str] = set()


def ensure_command(command: str, package: str) -> None:
    """Install the Debian ``package`` (scripts/ensure-debs.sh, as ``make bench`` does) if
    ``command`` is not on PATH; once per session."""
    if command in _installed or shutil.which(command):
        _installed.add(command)
        return
    # One install at a time across parallel test processes (xdist workers): two apt-get runs
    # at once fail on dpkg's lock. `make test` installs these first; this is for bare pytest.
    with open(os.path.join(tempfile.gettempdir(), "lameduck-tests-apt.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shutil.which(command):
            _installed.add(command)
            return
        r = subprocess.run(["bash", str(ROOT / "scripts" / "ensure-debs.sh"), package],
                           capture_output=True, text=True)
    if r.returncode != 0 or not shutil.which(command):
        raise RuntimeError(f"cannot install {package} (rc {r.returncode}):\n"
                           f"{r.stdout}{r.stderr}")
    _installed.add(command)


_seq = itertools.count(1)


def unique() -> str:
    """A name no other test of this run uses (this process's pid and a counter): for files
    and sockets a test creates."""
    return f"{os.getpid()}-{next(_seq)}"


_refusing: list[socket.socket] = []


def refusing_port() -> int:
    """A loopback port where every connect is refused for as long as this test process lives:
    a socket bound to it (port 0: the kernel's pick) that never listens, so the kernel answers
    a SYN with a reset, and no other process can bind the port meanwhile (the socket has no
    SO_REUSEADDR). For a dead endpoint, agent or store."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _refusing.append(s)
    return s.getsockname()[1]


def listening_socket(host: str = "127.0.0.1") -> socket.socket:
    """A listening socket on an ephemeral port, to hand to a child process (``pass_fds``)
    that serves on it: the port stays ours across the child's restarts."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    s.listen(1024)
    return s


def listening_ports(pid: int) -> set[int]:
    """The TCP ports ``pid`` or one of its children listens on, from /proc: the socket inodes
    among their descriptors, found LISTEN (state 0A) in /proc/PID/net/tcp and tcp6. How a test
    reads back the port of a server started on port 0 that does not print it."""
    inodes = set()
    for p in (pid, *children_of(pid)):
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{p}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(int(link[8:-1]))
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[9]) in inodes:
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def _read_lines(proc: subprocess.Popen, n: int, timeout: float) -> list[str]:
    """The first ``n`` lines of ``proc``'s stdout pipe, read straight off the fd (a buffered
    readline could swallow the second line, which a select() would then wait for in vain)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    end = time.monotonic() + timeout
    while buf.count(b"\n") < n:
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        data = os.read(fd, 4096)
        if not data:
            break
        buf += data
    return [ln.decode(errors="replace") for ln in buf.split(b"\n")[:n]]


def start_origin(stderr: IO[bytes] | int = subprocess.DEVNULL,
                 args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, int]:
    """Start ``python -m lameduck.demo --port 0 [args]`` and read the bound port from its
    stdout (the ``agent on`` line that ``--agent-port`` adds is left unread)."""
    proc, ports = _start_demo(stderr, args, 1)
    return proc, ports[0]


def _start_demo(stderr: IO[bytes] | int, args: tuple[str, ...],
                nlines: int) -> tuple[subprocess.Popen, list[int]]:
    """Start the demo origin and read the ports of its ``nlines`` startup lines
    (``listening on 127.0.0.1:P``, then ``agent on 127.0.0.1:P``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lameduck.demo", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=stderr, env=_env(),
    )
    lines = _read_lines(proc, nlines, 10)
    prefixes = ("listening on 127.0.0.1:", "agent on 127.0.0.1:")[:nlines]
    if len(lines) < nlines:
        stop(proc)
        raise RuntimeError(f"demo origin did not report its port(s) within 10 s: {lines!r}")
    for line, prefix in zip(lines, prefixes, strict=True):
        if not line.startswith(prefix):
            stop(proc)
            raise RuntimeError(f"unexpected startup line: {line!r}")
    return proc, [int(line.rsplit(":", 1)[1]) for line in lines]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)


class Origin:
    """A demo origin process started with ``--name`` (see ``start_named_origin``): answers
    carry ``x-origin: <name>``; ``log_lines()`` are the requests it saw (``--log``) as
    ``METHOD PATH X-REQUEST-ID``; ``agent_port`` serves its HAProxy agent check (``--agent-port``).
    """

    def __init__(self, proc: subprocess.Popen, port: int, name: str,
                 agent_port: int | None, log_path: Path | None, stderr: IO[bytes]) -> None:
        self.proc = proc
        self.port = port
        self.name = name
        self.agent_port = agent_port
        self.log_path = log_path
        self._stderr = stderr

    @property
    def addr(self) -> str:
        """``127.0.0.1:port``, as a cluster endpoint."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def url(self, path: str = "/") -> str:
        return f"http://{self.addr}{path}"

    def get(self, path: str = "/") -> httpx.Response:
        """GET straight from the origin (not through lameduck)."""
        return httpx.get(self.url(path), timeout=5)

    def post(self, path: str) -> httpx.Response:
        """POST straight to the origin: ``post("/health/fail")``, ``post("/agent?say=drain")``."""
        return httpx.post(self.url(path), timeout=5)

    def agent(self, timeout: float = 5.0) -> str:
        """What the agent port says now (the line, without its newline)."""
        assert self.agent_port is not None, "started without agent=True"
        with socket.create_connection(("127.0.0.1", self.agent_port), timeout=timeout) as s:
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        return data.decode().rstrip("\n")

    def log_lines(self) -> list[str]:
        """The request log so far: one ``METHOD PATH X-REQUEST-ID`` per request (PATH with its
        query; ``-`` for no x-request-id), written as each request's head arrived."""
        assert self.log_path is not None, "started without a log_dir"
        try:
            return self.log_path.read_text().splitlines()
        except FileNotFoundError:
            return []

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL it (if still running) and reap it."""
        stop(self.proc)

    def close(self) -> None:
        """Kill it and release its stderr file."""
        self.kill()
        self._stderr.close()


def start_named_origin(name: str, log_dir: Path | None = None, agent: bool = False,
                       args: tuple[str, ...] = ()) -> Origin:
    """Start a demo origin with ``--name name`` on a free port; with ``log_dir``, it logs its
    requests to ``log_dir/<name>.log``; with ``agent``, it serves an agent check on another
    free port; ``args`` are more options (``--agent-say maint``). Stop it with ``kill()`` (the
    ``origins`` fixture does)."""
    import tempfile

    args = ("--name", name, *args)
    log_path = None
    if log_dir is not None:
        log_path = log_dir / f"{name}.log"
        args += ("--log", str(log_path))
    if agent:
        args += ("--agent-port", "0")
    err = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the origin)
    try:
        proc, ports = _start_demo(err, args, 2 if agent else 1)
    except BaseException:
        err.close()
        raise
    return Origin(proc, ports[0], name, ports[1] if agent else None, log_path, err)


def base_config(origin_port: int, **over: Any) -> dict[str, Any]:
    """A config for one listener in front of the origin; ``over`` replaces top-level keys and
    ``listener`` / ``cluster`` / ``route`` merge into the first of each. The admin API and the
    listener bind port 0: ``Lameduck.start`` reads back the ports they got."""
    cfg: dict[str, Any] = {
        "admin": {"address": "127.0.0.1:0"},
        "drain": {"time": "2s", "strategy": "gradual", "connection_grace": "200ms"},
        "shutdown": {"deadline": "4s", "min_drain": "0s", "stop_accepting": "at_drain_end"},
        "listeners": [{
            "name": "ingress",
            "address": "127.0.0.1:0",
            "health_check_path": "/health_check.html",
            "routes": [{"prefix": "/", "cluster": "app", "timeout": "30s"}],
        }],
        "clusters": [{"name": "app", "endpoints": [f"127.0.0.1:{origin_port}"]}],
    }
    for key in ("listener", "cluster", "route"):
        extra = over.pop(key, None)
        if extra:
            target = {"listener": cfg["listeners"][0], "cluster": cfg["clusters"][0],
                      "route": cfg["listeners"][0]["routes"][0]}[key]
            target.update(extra)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return cfg


def children_of(pid: int) -> list[int]:
    """Live (not zombie) child processes of ``pid``, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ")"
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


# ``workers`` for a config that does not say: the integration conftest's ``workers`` fixture
# runs the drain, hot-restart, prestop and balancing tests with 1 and with 2.
DEFAULT_WORKERS = 1


class Lameduck:
    """A lameduck process started with a config, stopped by pid. Started, it has written its
    admin address to ``admin_path`` (``--admin-address-path``) and its listeners' addresses
    are read from the admin's ``/listeners``: ``admin_addr``, ``addr`` (the first listener),
    ``addr_of(name)``; before that they are the configured ones."""

    # Every one created, so a fixture can stop what a failed test left running (a hot-restart
    # successor, a supervisor and its children).
    created: list[Lameduck] = []

    def __init__(self, cfg: dict[str, Any], workdir: Path) -> None:
        Lameduck.created.append(self)
        self.cfg = cfg
        n = unique()
        # Its own rendezvous under the test's tmp dir, unless the test shares one on purpose
        # (hot restart): not the default in $TMPDIR, which a SIGKILLed process leaves behind.
        if DEFAULT_WORKERS != 1:
            cfg.setdefault("workers", DEFAULT_WORKERS)
        hot = cfg.setdefault("hot_restart", {})
        hot.setdefault("socket", str(workdir / f"restart-{n}.sock"))
        self.path = workdir / f"lameduck-{n}.yaml"
        self.path.write_text(yaml.safe_dump(cfg))
        self.log_path = self.path.with_suffix(".log")
        self.admin_path = self.path.with_suffix(".admin")
        self.admin_addr: str = cfg["admin"]["address"]
        token_file = cfg["admin"].get("token_file")
        # admin.token_file set: every admin request sends the token (docs/admin.md)
        self.admin_headers: dict[str, str] = (
            {"Authorization": f"Bearer {Path(token_file).read_text().strip()}"}
            if token_file else {})
        self.addrs: dict[str, str] = {lc["name"]: lc["address"] for lc in cfg["listeners"]}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0, wrapper: list[str] | None = None,
              env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = (),
              command: str = "run", args: tuple[str, ...] = ()) -> Lameduck:
        """``timeout``: generous, as it is only an upper bound (this returns once ready): on
        a loaded 2-core machine two workers' start-up alone has taken over 10 s.
        ``wrapper``: argv run first, that execs the rest (e.g. tests/sdactivate.py);
        ``env``: variables added; ``pass_fds``: descriptors the process inherits;
        ``command``: ``run`` or ``supervise``; ``args``: more options (``--hot-restart``)."""
        self.admin_path.unlink(missing_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [*(wrapper or []), sys.executable, "-m", "lameduck", command, "-c",
                 str(self.path), "--admin-address-path", str(self.admin_path), *args],
                stdout=log, stderr=subprocess.STDOUT, env={**_env(), **(env or {})},
                pass_fds=pass_fds,
            )
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lameduck exited early:\n{self.log()}")
            # the address file appears once it serves (after a hot restart's handover)
            if self.reread():
                try:
                    if httpx.get(self.admin_url("/ready"), headers=self.admin_headers,
                                 timeout=1).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"lameduck not ready within {timeout}s:\n{self.log()}")

    def reread(self) -> bool:
        """Read the admin address from ``admin_path`` and the listeners' from ``/listeners``;
        False if the file is not there yet or the admin does not answer (a child of
        ``lameduck supervise`` restarted after it died binds new ports and rewrites it)."""
        try:
            admin = self.admin_path.read_text().strip()
            r = httpx.get(f"http://{admin}/listeners?format=json", headers=self.admin_headers,
                          timeout=2)
        except (OSError, httpx.HTTPError):
            return False
        if r.status_code != 200:
            return False
        addrs = {}
        for ls in r.json()["listener_statuses"]:
            sa = ls["local_address"]["socket_address"]
            host = f"[{sa['address']}]" if ":" in sa["address"] else sa["address"]
            addrs[ls["name"]] = f"{host}:{sa['port_value']}"
        self.admin_addr, self.addrs = admin, addrs
        return True

    @property
    def addr(self) -> str:
        """The first listener's ``host:port``."""
        return self.addrs[self.cfg["listeners"][0]["name"]]

    def addr_of(self, listener: str) -> str:
        """The ``host:port`` the listener named ``listener`` is bound to."""
        return self.addrs[listener]

    def port_of(self, listener: str) -> int:
        return int(self.addrs[listener].rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    def url(self, path: str = "/") -> str:
        return f"http://{self.addr}{path}"

    def admin_url(self, path: str) -> str:
        return f"http://{self.admin_addr}{path}"

    def admin(self, method: str, path: str) -> httpx.Response:
        return httpx.request(method, self.admin_url(path), headers=self.admin_headers, timeout=5)

    def stats(self) -> dict[str, int]:
        body = self.admin("GET", "/stats?format=json").json()
        # (the last element may be Envoy's {"histograms": ...}, which has no name)
        return {s["name"]: s["value"] for s in body["stats"] if "name" in s}

    def stat(self, name: str) -> int:
        return self.stats()[name]

    def server_info(self) -> dict[str, Any]:
        return json.loads(self.admin("GET", "/server_info").text)

    def drain_elapsed(self) -> float:
        """Seconds since the drain under way started, by the server's own clock
        (``/server_info``'s ``drain.elapsed``); -1 before any drain. A test that waits on it
        is as far along as the server, however late the signal or the request arrived."""
        return float(self.server_info()["drain"].get("elapsed", -1.0))

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL it, and its children first (``lameduck supervise`` has some)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                for child in children_of(self.proc.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, signal.SIGKILL)
            stop(self.proc)


# -- helpers for the drain, admin and CLI integration tests -------------------------------------


SIGHUP_STARTED = re.compile(r"SIGHUP: hot restart: started pid (\d+)")


def _serving_pid(ld: Lameduck) -> int | None:
    """The pid behind the admin port now (None while it changes hands)."""
    try:
        return int(ld.server_info()["pid"]) if ld.reread() else None
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def _reaped(pid: int, codes: dict[int, int], log: Callable[[], str] | None = None) -> bool:
    """``pid`` (a child of this process, or adopted by it) has exited; its code in ``codes``.
    One that exited before the process that started it was reaped by that one, which logged
    its code (``log``)."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        m = None if log is None or pid in codes else re.search(
            rf"pid {pid}, which took over from this one, exited with (-?\d+)", log())
        if m is not None:
            codes[pid] = int(m.group(1))
        return pid in codes
    if got == 0:
        return False
    codes[pid] = os.waitstatus_to_exitcode(status)
    return True


def sighup_restart(ld: Lameduck, pid: int, epoch: int, subreaper: list[int],
                   codes: dict[int, int], wait_exit: bool = True) -> int:
    """SIGHUP ``pid``; wait until the process it starts serves as ``epoch`` and (unless not
    ``wait_exit``: see ``exited_cleanly``) ``pid`` has exited; the new pid."""
    os.kill(pid, signal.SIGHUP)
    found: list[int] = []

    def started() -> bool:
        pids = [int(p) for p in SIGHUP_STARTED.findall(ld.log())]
        found[:] = pids[epoch - 1:epoch]
        return bool(found)

    # upper bounds on a process's start-up, returned from as soon as it is done: a new main
    # process and two workers took over 15 s to serve at load 12
    assert wait_until(started, 30, 0.01), ld.log()
    new = found[0]
    subreaper.append(new)  # killed by pid at teardown if the test fails before that
    assert wait_until(lambda: _serving_pid(ld) == new, 30, 0.01), ld.log()
    assert ld.stat("server.hot_restart_epoch") == epoch
    if wait_exit:
        exited_cleanly(ld, pid, codes)
    return new


def exited_cleanly(ld: Lameduck, pid: int, codes: dict[int, int], timeout: float = 30) -> None:
    """``pid``, a process ``sighup_restart`` replaced, exits 0 within ``timeout``."""
    if pid == ld.pid:  # the first one is our child: Popen reaps it
        assert ld.wait(timeout) == 0, ld.log()
    else:  # later ones were adopted (subreaper) when the one that started them exited
        assert wait_until(lambda: _reaped(pid, codes, ld.log), timeout, 0.01), ld.log()
        assert codes[pid] == 0, (pid, codes[pid], ld.log())


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True if something listens on host:port (or the port cannot be bound). SO_REUSEADDR,
    as every server here binds: connections of a process gone, left in TIME_WAIT on that
    port (60 s after the side that closed first), do not keep it from binding."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def wait_until(pred: Any, timeout: float = 5.0, interval: float = 0.005) -> bool:
    """Poll ``pred()`` until it is true or ``timeout`` passes; returns its last truth."""
    end = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval)


class RawResponse:
    """A response read off a raw socket: status, lower-cased headers, body, and whether the
    body arrived complete (a chunked body needs its last chunk, a sized one all its bytes)."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes,
                 complete: bool) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.complete = complete

    def header(self, name: str) -> str | None:
        name = name.lower()
        for n, v in self.headers:
            if n == name:
                return v
        return None

    @property
    def closes(self) -> bool:
        """The response says ``Connection: close``."""
        v = self.header("connection")
        return v is not None and "close" in v.lower()


class RawConn:
    """One HTTP/1.1 client connection over a plain socket, so a test sees exactly what went over
    the wire: keep-alive reuse, ``Connection: close``, an EOF, a reset."""

    def __init__(self, addr: str, timeout: float = 5.0) -> None:
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.host = addr
        self.reset = False  # the server reset the connection

    def send(self, path: str, method: str = "GET", headers: dict[str, str] | None = None) -> None:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())

    def _more(self) -> bool:
        """Read more; False at EOF or on a reset (``self.reset`` tells which)."""
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            self.reset = True
            return False
        if not data:
            return False
        self.buf += data
        return True

    def read_response(self, head_only: bool = False) -> RawResponse:
        """Read one response. Raises ConnectionError when the connection ends before the head;
        a body cut short (EOF or reset) gives ``complete=False``."""
        while b"\r\n\r\n" not in self.buf:
            if not self._more():
                raise ConnectionError(f"EOF before a response head (got {self.buf!r})")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        first, *lines = head.decode("latin-1").split("\r\n")
        status = int(first.split()[1])
        headers = [(n.strip().lower(), v.strip())
                   for n, _, v in (ln.partition(":") for ln in lines)]
        resp = RawResponse(status, headers, b"", True)
        if head_only or status in (204, 304) or 100 <= status < 200:
            return resp
        if (resp.header("transfer-encoding") or "").lower() == "chunked":
            resp.body, resp.complete = self._chunked()
        elif resp.header("content-length") is not None:
            n = int(resp.header("content-length") or 0)
            while len(self.buf) < n:
                if not self._more():
                    break
            resp.body, self.buf = self.buf[:n], self.buf[n:]
            resp.complete = len(resp.body) == n
        else:  # close-delimited
            while self._more():
                pass
            resp.body, self.buf = self.buf, b""
            resp.complete = not self.reset
        return resp

    def read_chunked(self) -> tuple[bytes, bool]:
        """The rest of a chunked body after ``read_response(head_only=True)``: (body, complete)."""
        return self._chunked()

    def _chunked(self) -> tuple[bytes, bool]:
        body = b""
        while True:
            while b"\r\n" not in self.buf:
                if not self._more():
                    return body, False
            size_line, rest = self.buf.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(rest) < size + 2:
                if not self._more():
                    return body + rest[:size], False
                size_line, rest = self.buf.split(b"\r\n", 1)
            body += rest[:size]
            self.buf = rest[size + 2:]
            if size == 0:
                return body, True

    def request(self, path: str, method: str = "GET",
                headers: dict[str, str] | None = None) -> RawResponse:
        self.send(path, method, headers)
        return self.read_response(head_only=method == "HEAD")

    def wait_eof(self, timeout: float) -> bool:
        """True when the server ends the connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while self._more():
                pass
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


# -- HTTP/1 data-plane test helpers: origin restarts, process memory, raw-socket responses ----


def start_origin_on(sock: socket.socket,
                    stderr: IO[bytes] | int = subprocess.DEVNULL) -> subprocess.Popen:
    """Start the demo origin serving on ``sock`` (``--fd``: a listening socket the test holds,
    so an origin restarted in place gets the same port and no other process can take it in
    between); waits until it listens."""
    port = sock.getsockname()[1]
    fd = sock.fileno()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lameduck.demo", "--fd", str(fd)],
        stdout=subprocess.PIPE, stderr=stderr, env=_env(), pass_fds=(fd,),
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    line = proc.stdout.readline().decode() if ready else ""
    if line.strip() != f"listening on 127.0.0.1:{port}":
        stop(proc)
        raise RuntimeError(f"demo origin did not start on port {port}: {line!r}")
    return proc


def rss_kb(pid: int) -> int:
    """Resident set size of a process in KiB (VmRSS from /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def until_closed(addr: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes to ``host:port`` and read until the server closes; a connection still
    open after ``timeout`` fails the test (the request was one that must end it)."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            raise AssertionError(f"the connection was not closed; got {out[:200]!r}") from None
    return out


def raw_connect(port: int, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class WireResponse:
    """One HTTP/1.x response as it came off the wire (see ``read_wire_response``)."""

    def __init__(self, version: str, status: int, headers: list[tuple[str, str]]) -> None:
        self.version = version
        self.status = status
        self.headers = headers  # names lower-cased, in wire order
        self.body = b""
        self.framing = "none"  # none | length | chunked | close
        self.chunks: list[int] = []  # sizes of the chunks of a chunked body, as framed
        self.complete = True  # False: the body ended early (EOF or reset)

    def header(self, name: str) -> str | None:
        for n, v in self.headers:
            if n == name:
                return v
        return None

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.headers)


def read_wire_response(f: IO[bytes], *, head: bool = False) -> WireResponse:
    """Read one response off a socket file, framing as RFC 9112 §6.3 says. A body cut short
    (EOF or a reset) gives ``complete = False`` instead of an exception; a missing status line
    raises ``EOFError``."""
    line = f.readline()
    if not line:
        raise EOFError("connection closed before a status line")
    version, status, *_ = line.decode("latin-1").split(" ", 2)
    resp = WireResponse(version, int(status), [])
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        resp.headers.append((name.strip().lower(), value.strip()))
    if head or resp.status in (204, 304) or resp.status < 200:
        return resp
    te = resp.header("transfer-encoding")
    cl = resp.header("content-length")
    body = bytearray()
    try:
        if te is not None and te.lower().endswith("chunked"):
            resp.framing = "chunked"
            while True:
                size_line = f.readline()
                if not size_line.endswith(b"\r\n"):
                    resp.complete = False
                    break
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    while (t := f.readline()) not in (b"\r\n", b""):
                        pass
                    resp.complete = t == b"\r\n"
                    break
                resp.chunks.append(size)
                data = f.read(size)
                body += data
                if len(data) < size or f.read(2) != b"\r\n":
                    resp.complete = False
                    break
        elif cl is not None:
            resp.framing = "length"
            want = int(cl)
            while len(body) < want:
                data = f.read(min(want - len(body), 1 << 20))
                if not data:
                    break
                body += data
            resp.complete = len(body) == want
        else:
            resp.framing = "close"
            while data := f.read(1 << 20):
                body += data
    except (ConnectionResetError, TimeoutError, OSError):
        resp.complete = False
    resp.body = bytes(body)
    return resp


def wait_closed(sock: socket.socket, timeout: float = 5.0) -> bool:
    """True once the peer closed (EOF or reset) within ``timeout``; bytes still arriving are
    read and dropped."""
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False



class AdminPoller:
    """A keep-alive raw connection to the admin API: polls in about a millisecond, fast enough
    to catch a 20 ms request in flight (``httpx.get`` builds a client each call)."""

    def __init__(self, admin_addr: str) -> None:
        self.conn = RawConn(admin_addr)

    def stats(self, filter: str | None = None) -> dict[str, int]:
        from urllib.parse import quote

        path = "/stats?format=json" + (f"&filter={quote(filter, safe='')}" if filter else "")
        body = json.loads(self.conn.request(path).body)
        # (the last element may be Envoy's {"histograms": ...}, which has no name)
        return {s["name"]: s["value"] for s in body["stats"] if "name" in s}

    def stat(self, name: str) -> int:
        return self.stats("^" + name.replace(".", "\\.") + "$").get(name, -1)

    def close(self) -> None:
        self.conn.close()


class StatsDelta:
    """Counters of a long-lived lameduck relative to a starting point, so tests can share one
    process: ``d = StatsDelta(ld)`` ... ``d["http.x.downstream_rq_4xx"]`` (gauges read as is)."""

    def __init__(self, ld: Lameduck) -> None:
        self.ld = ld
        self.before = ld.stats()
        self.now = self.before

    def refresh(self) -> StatsDelta:
        self.now = self.ld.stats()
        return self

    def __getitem__(self, name: str) -> int:
        return self.now[name] - self.before.get(name, 0)

    def gauge(self, name: str) -> int:
        return self.ld.stat(name)


def refused(addr: str) -> bool:
    """Whether a TCP connect to ``host:port`` is refused (the listener is closed)."""
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return False
    except ConnectionRefusedError:
        return True
    except TimeoutError:  # a SYN still queued as the listener closes (a loaded machine): ask again
        return False


WSECHO = Path(__file__).resolve().parent / "wsecho.py"
# argv that runs a command with sockets passed as systemd socket activation passes them
SDACTIVATE = [sys.executable, str(Path(__file__).resolve().parent / "sdactivate.py")]


class WsEcho:
    """tests/wsecho.py (a real websockets echo server) in its own process, stopped by pid;
    ``closes(n)`` reads the close codes it saw from its peers."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(WSECHO), "0"],
                                     stdout=subprocess.PIPE, text=True)
        line = (_read_lines(self.proc, 1, 10) or [""])[0]
        if not line.startswith("listening on 127.0.0.1:"):
            stop(self.proc)
            raise RuntimeError(f"wsecho did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        self.lines: list[str] = []

    def closes(self, n: int, timeout: float = 5.0) -> list[str]:
        """The first ``n`` connection-end lines the server printed."""
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        end = time.monotonic() + timeout
        while len(self.lines) < n and time.monotonic() < end:
            if sel.select(max(0.0, end - time.monotonic())):
                line = self.proc.stdout.readline()
                if not line:
                    break
                self.lines.append(line.strip())
        return self.lines[:n]


H2ORIGIN = Path(__file__).resolve().parent / "h2origin.py"


class H2Origin:
    """tests/h2origin.py (an h2c origin on the ``h2`` library) in its own process, stopped by
    pid. A reader thread collects its stdout lines (see the module docstring for them):
    ``lines()`` is what it printed so far, ``records("request")`` those lines parsed, and
    ``wait_line(...)`` polls for one."""

    def __init__(self, max_streams: int | None = None, window: int | None = None,
                 args: tuple[str, ...] = (), timeout: float = 30.0) -> None:
        import tempfile
        import threading

        cmd = [sys.executable, str(H2ORIGIN), "--port", "0"]
        if max_streams is not None:
            cmd += ["--max-streams", str(max_streams)]
        if window is not None:
            cmd += ["--window", str(window)]
        cmd += list(args)
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the origin)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._err, text=True)
        assert self.proc.stdout is not None
        # read off the fd, as the lines after it will be (a buffered readline could take them)
        line = (_read_lines(self.proc, 1, timeout) or [""])[0]
        if not line.startswith("listening on 127.0.0.1:"):
            stop(self.proc)
            raise RuntimeError(f"h2origin did not start: {line!r} {self.stderr()}")
        self.port = int(line.rsplit(":", 1)[1])
        self.addr = f"127.0.0.1:{self.port}"
        self._lines: list[str] = []
        self._partial = b""
        self._fd = self.proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._lock = threading.Lock()
        self._eof = False
        # A thread keeps the pipe from filling up; ``lines()`` also takes what is pending
        # itself, so a line printed before a response is seen once the response came.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        """Take what the pipe holds (the caller holds the lock)."""
        while not self._eof:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._eof = True
                return
            *done, self._partial = (self._partial + data).split(b"\n")
            self._lines.extend(d.decode(errors="replace") for d in done)

    def _read(self) -> None:
        while not self._eof:
            try:
                select.select([self._fd], [], [], 0.05)
            except (OSError, ValueError):
                return
            with self._lock:
                self._drain()

    def url(self, path: str = "/") -> str:
        return f"http://{self.addr}{path}"

    def lines(self, prefix: str = "") -> list[str]:
        """The stdout lines so far (after the ``listening`` one) that start with ``prefix``."""
        with self._lock:
            self._drain()
            return [ln for ln in self._lines if ln.startswith(prefix)]

    def records(self, kind: str) -> list[dict[str, str]]:
        """Lines of one kind (``request``, ``closed``, ``goaway-received``, ...) as dicts of
        their ``key=value`` fields: ``{"conn": "1", "stream": "3", "method": "GET", ...}``."""
        out = []
        for ln in self.lines(kind + " "):
            fields = ln.split(" ")[1:]
            out.append(dict(f.partition("=")[::2] for f in fields if "=" in f))
        return out

    def wait_line(self, prefix: str, count: int = 1, timeout: float = 5.0) -> bool:
        """True once at least ``count`` lines starting with ``prefix`` were printed."""
        return wait_until(lambda: len(self.lines(prefix)) >= count, timeout, 0.01)

    def stderr(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        stop(self.proc)
        self._reader.join(timeout=5)


PERSISTENCE_COOKIE = re.compile(r"^lameduck=([0-9a-f]+); Path=/; HttpOnly$")


class Reply:
    """What a client saw through a balancing lameduck: the status, the origin that answered
    (the demo origin's ``x-origin``) and the persistence cookie set, if any (its value)."""

    def __init__(self, r: httpx.Response, http_version: str | None = None) -> None:
        if http_version is not None:
            assert r.http_version == http_version, r.http_version
        self.status = r.status_code
        self.origin = r.headers.get("x-origin")
        self.text = r.text
        self.headers = r.headers
        sc = r.headers.get_list("set-cookie")
        assert len(sc) <= 1, sc
        self.cookie: str | None = None
        if sc:
            m = PERSISTENCE_COOKIE.match(sc[0])
            assert m, f"unexpected set-cookie {sc[0]!r}"
            self.cookie = m.group(1)


def until_moved_off(ask: Any, origin: str, t0: float, within: float = 8.0,
                    ) -> tuple[Reply, float, int]:
    """A sticky client on a DRAIN endpoint, asking every 100 ms (``ask()`` -> ``Reply``)
    until an answer comes from another origin than ``origin``: that answer, how long after
    ``t0`` it came, and how many answers stayed first (counting the one before the loop).
    While it stays, no answer sets a new cookie."""
    sticky = 1
    while time.monotonic() < t0 + within:
        r = ask()
        if r.origin != origin:
            return r, time.monotonic() - t0, sticky
        assert r.cookie is None
        sticky += 1
        time.sleep(0.1)
    raise AssertionError(f"never moved off the DRAIN endpoint {origin} in {within} s")
