"""Fixtures: a real origin process and real lameduck processes, stopped by pid."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from tests.peers import Destination
from tests.procs import (
    SDACTIVATE,
    H2Origin,
    Lameduck,
    Origin,
    WsEcho,
    base_config,
    children_of,
    start_named_origin,
    start_origin,
    stop,
)

PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


@pytest.fixture(scope="module", params=[1, 2], ids=["workers1", "workers2"])
def workers(request: pytest.FixtureRequest) -> Iterator[int]:
    """A module marked ``pytest.mark.usefixtures("workers")`` runs twice: its lameducks with
    one process, then with a main process and two workers (a config that names ``workers``
    keeps its own)."""
    from tests import procs

    procs.DEFAULT_WORKERS = request.param
    try:
        yield request.param
    finally:
        procs.DEFAULT_WORKERS = 1


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen, int]]:
    errlog = tmp_path_factory.mktemp("origin") / "stderr.log"
    with errlog.open("wb") as err:
        proc, port = start_origin(err)
    try:
        yield proc, port
    finally:
        stop(proc)
    # Handler bugs surface as tracebacks on stderr, even when the client saw nothing odd.
    assert "Traceback" not in errlog.read_text(errors="replace")


@pytest.fixture
def origin_port(origin: tuple[subprocess.Popen, int]) -> int:
    return origin[1]


@pytest.fixture(autouse=True)
def _no_stray_lameduck() -> Iterator[None]:
    """What a test started and did not stop (it failed first) is stopped by pid. Only what
    it started: a module-scoped lameduck (set up before this) serves the module's tests."""
    before = len(Lameduck.created)
    yield
    while len(Lameduck.created) > before:
        Lameduck.created.pop().kill()


@pytest.fixture
def lameduck(
    origin_port: int, tmp_path: Path
) -> Iterator[Callable[..., Lameduck]]:
    """``lameduck(**overrides)`` starts a lameduck in front of the origin (see base_config).
    ``activate``: a listening socket its first listener serves on, passed the way systemd
    socket activation passes it (tests/sdactivate.py), so the test holds the port and a
    lameduck restarted in place serves on the same one."""
    started: list[Lameduck] = []

    def make(cfg: dict[str, Any] | None = None, activate: socket.socket | None = None,
             **over: Any) -> Lameduck:
        ld = Lameduck(cfg or base_config(origin_port, **over), tmp_path)
        started.append(ld)
        if activate is None:
            return ld.start()
        fd = activate.fileno()
        name = ld.cfg["listeners"][0]["name"]
        return ld.start(wrapper=[*SDACTIVATE, f"{fd}={name}", "--"], pass_fds=(fd,))

    yield make
    for ld in started:
        ld.kill()
        # A traceback in lameduck's log is a bug even if every client check passed.
        assert "Traceback" not in ld.log(), ld.log()


@pytest.fixture
def origins(tmp_path: Path) -> Iterator[Callable[..., list[Origin]]]:
    """``origins(n, agent=False, log=False)`` starts ``n`` named demo origins (``o1``, ``o2``,
    ...; a second call in the same test goes on from the next number) and returns them, each
    with ``--agent-port`` if ``agent`` and a request log under tmp_path if ``log``. Every one
    is SIGKILLed and reaped at teardown."""
    started: list[Origin] = []

    def make(n: int, agent: bool = False, log: bool = False) -> list[Origin]:
        made = []
        for _ in range(n):
            o = start_named_origin(f"o{len(started) + 1}", tmp_path if log else None, agent)
            started.append(o)
            made.append(o)
        return made

    yield make
    for o in started:
        o.kill()
    errors = {o.name: o.stderr() for o in started}
    for o in started:
        o.close()
    # A handler bug shows as a traceback on its stderr even if every client check passed.
    for name, err in errors.items():
        assert "Traceback" not in err, f"{name}: {err}"


@pytest.fixture
def wsecho() -> Iterator[WsEcho]:
    """A real WebSocket echo server (tests/wsecho.py), stopped by pid."""
    server = WsEcho()
    try:
        yield server
    finally:
        stop(server.proc)


@pytest.fixture
def h2origin() -> Iterator[Callable[..., H2Origin]]:
    """``h2origin(max_streams=None, window=None, args=())`` starts a real h2c origin
    (tests/h2origin.py) and returns it; every one started is stopped by pid at teardown."""
    started: list[H2Origin] = []

    def make(**kw: Any) -> H2Origin:
        o = H2Origin(**kw)
        started.append(o)
        return o

    yield make
    for o in started:
        o.stop()
    for o in started:
        # A handler bug shows as a traceback on its stderr even if every client check passed.
        assert "Traceback" not in o.stderr(), o.stderr()


@pytest.fixture
def destination() -> Iterator[Destination]:
    """A CONNECT destination that answers with the size and sha256 of what it got."""
    d = Destination()
    try:
        yield d
    finally:
        d.close()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    d = tmp_path_factory.mktemp("tls")
    ca_pem, cert_pem, key_pem = d / "ca.pem", d / "cert.pem", d / "key.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    cert.private_key_pem.write_to_path(str(key_pem))
    cert_pem.write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    return ca_pem, cert_pem, key_pem


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``haproxy(backend_ports, **kw)`` starts HAProxy (tests/haproxy.py) in front of those
    ports, health-checking each (``path``, ``interval``, ``fall``, ``rise``); installs the
    Debian package first if ``haproxy`` is not on PATH. Every one is stopped by pid."""
    from tests.haproxy import Haproxy, ensure_haproxy

    ensure_haproxy()
    started: list[Haproxy] = []

    def make(backend_ports: list[int], **kw: Any) -> Haproxy:
        h = Haproxy(backend_ports, tmp_path / f"haproxy{len(started) + 1}", start=False, **kw)
        started.append(h)
        return h.start()

    yield make
    for h in started:
        h.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Any]:
    """A real ``redis-server`` (tests/redisproc.py) on a Unix socket of its own, stopped by
    pid; installs the Debian package first if it is missing."""
    from tests.redisproc import RedisServer, ensure_redis

    ensure_redis()
    r = RedisServer(tmp_path / "redis").start()
    yield r
    r.stop()


@pytest.fixture
def resume_app(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``resume_app(server, name, store, grace=, stagger=)``: the demo resume app under a real
    ASGI server (tests/apps.py); every one is stopped by pid."""
    from tests.apps import App

    started: list[App] = []

    def make(server: str = "uvicorn", name: str = "a", store: str | None = None,
             **kw: Any) -> App:
        app = App(server, name, store or f"sqlite://{tmp_path / 'sessions.db'}",
                  tmp_path / "apps", **kw)
        started.append(app)
        return app

    yield make
    for a in started:
        a.stop()


@pytest.fixture
def subreaper() -> Iterator[list[int]]:
    """This test process adopts its orphaned descendants (a process SIGHUP started outlives
    the one that started it), so they can be stopped and reaped by pid: the list they are
    put in is SIGKILLed and waited for at teardown, with the children each still has (a
    main process's workers, which would be adopted here once it dies)."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    pids: list[int] = []
    try:
        yield pids
    finally:
        # all killed first, then reaped parents first: a child is adopted here once its
        # parent is dead, and only then can it be waited for
        everyone = pids + [child for p in pids for child in children_of(p)]
        for pid in everyone:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in everyone:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
