#!/usr/bin/env python3
"""lameduck vs HAProxy vs nginx: keep-alive GET / through each proxy to the same origin.

The origin (--origin, default nginx) is one nginx process answering a fixed body with the
headers real origins send (Connection: keep-alive, Date, Server); --origin demo puts the Python
demo origin there instead. HTTP/1.1 rows: wrk against all three proxies. HTTP/2 rows (--h2, the
default): h2load over h2c prior knowledge against lameduck and HAProxy, in two shapes (5
connections x 10 streams, 50 connections x 1 stream); the origin stays HTTP/1.1 behind both.
HTTP/2-upstream rows (--h2-upstream, the default): wrk (HTTP/1.1) against lameduck and HAProxy,
each forwarding to an nginx origin that speaks only h2c (HTTP/2 prior knowledge). Pool rows
(--pool, the default): wrk against lameduck and HAProxy, each spreading requests round robin
over three origins (as --origin) with active health checks on. TLS rows (--tls, the default):
wrk over https keep-alive against lameduck and HAProxy, each terminating TLS 1.3 (same cipher
suite) and forwarding over plain HTTP/1.1 to the origin. Response-shape rows (--shapes,
the default), in the HTTP/1.1 rounds: wrk against lameduck and HAProxy for each of five
response shapes (plain: no Connection header, from an HAProxy origin; keep-alive, chunked, a
16 KiB static file, 30 header fields: from one nginx origin), and against a minimal uvloop +
httptools relay (bench/floor_relay.py, "the floor") for keep-alive. --lameduck-base PATH adds a
second lameduck build (lameduck-base) to the HTTP/1.1, h2 and h2-upstream rounds, for a
before/after comparison in the same run. Every row shows the proxy's CPU, the load CPU and which
was the limit; a ratio to HAProxy is printed only when both rows' proxies were saturated.

Run with ``make bench`` (or ``.venv/bin/python bench/run.py --help``). Everything listens on
127.0.0.1, every process it starts is stopped by pid before it returns (also on Ctrl-C and
SIGTERM), and the default run takes about seven minutes (two of them the shape rows). See
bench/README.md.

Layout on a 2-core machine:
    CPU 0 (--proxy-cpu): the proxy under test (one of three, all pinned there; the floor relay)
    CPU 1 (--load-cpu):  the origins (nginx or demo), the nginx h2c origin, the shape origins
                         (nginx, HAProxy) and wrk / h2load
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import ctypes
import functools
import http.client
import importlib.util
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Literal

import yaml

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "bench" / "out"
HELLO = b"hello from the lameduck demo origin\n"
# lameduck-log: lameduck with its access log on (to a file), for what the log costs per request
PROXIES = ("lameduck", "lameduck-log", "haproxy", "nginx")
# --lameduck-base PATH: another lameduck build, same config, measured beside lameduck
BASE = "lameduck-base"
# --origin: what answers behind the proxies (and behind the pool)
ORIGINS = ("nginx", "demo")
CLK_TCK = os.sysconf("SC_CLK_TCK")
# % of a core at which a core, or a single-threaded process, is the limit.
SATURATED = 95.0
# A proxy below this % of its core (its utime+stime over the round's wall time) was not the
# limit: its req/s is what the other side allowed, so no req/s ratio is printed for its row.
PROXY_SATURATED = 85.0

# The HTTP/1.1 target: CPU per keep-alive GET and req/s against HAProxy.
TARGET_CPU_US = 50.0
TARGET_RATIO = 0.6
TARGET_LINE = (f"target: lameduck <= {TARGET_CPU_US:g} µs CPU per keep-alive GET, "
               f">= {TARGET_RATIO:g}x HAProxy req/s (same run)")

# HTTP/2 (h2c prior knowledge, h2load): the proxies that speak it here, the two load shapes
# (name, connections, concurrent streams per connection) and the HTTP/2 target.
H2_PROXIES = ("lameduck", BASE, "haproxy")
H2_SHAPES = (("5x10", 5, 10), ("50x1", 50, 1))
# h2c clients -> proxy -> the h2c origin (gRPC's path: HTTP/2 on both sides), 5x10, when the
# h2c origin runs. Informational: the targets are for the two shapes above.
H2H2_SHAPE = ("h2-h2", 5, 10)
TARGET_H2_CPU_US = 100.0
TARGET_H2_RATIO = 0.25
TARGET_H2_LINE = (f"target (h2c): lameduck >= {TARGET_H2_RATIO:g}x HAProxy req/s and "
                  f"<= {TARGET_H2_CPU_US:g} µs CPU per request over h2c, in both shapes")

# HTTP/1.1 clients -> proxy -> HTTP/2 (h2c prior knowledge) upstream: an nginx origin that
# speaks only h2c, behind a second listener (lameduck) / frontend (HAProxy). No target.
H2UP_PROXIES = ("lameduck", BASE, "haproxy")
H2_HELLO = b"hello from the h2 origin\n"
H2UP_LISTENER, H2UP_CLUSTER = "ingress-h2up", "origin-h2"
H2UP_STREAMS = 100  # lameduck's clusters[].http2.max_concurrent_streams (its default)

# HTTP/1.1 through a pool of POOL_SIZE demo origins, round robin, active health checks on
# (GET /health every second, rise 2, fall 3), behind a third listener (lameduck) / frontend
# (HAProxy) of the same processes. No target.
POOL_PROXIES = ("lameduck", "haproxy")
POOL_SIZE = 3
POOL_LISTENER, POOL_CLUSTER = "ingress-pool", "origin-pool"
POOL_HAPROXY_BACKEND = "origin_pool"
POOL_HEALTH_CHECK = {"path": "/health", "interval": "1s", "timeout": "1s", "rise": 2, "fall": 3}

# HTTPS: wrk over TLS keep-alive to a fourth listener (lameduck) / frontend (HAProxy) of the
# same processes, forwarding over plain HTTP/1.1 to the same origin as the HTTP/1.1 rows. The
# handshake is paid once per connection; what the row measures is the per-request cost of TLS
# records (the request read, the response written). Target: lameduck's CPU µs per request at
# most TARGET_TLS_RATIO x HAProxy's, in the same run, both saturated.
TLS_PROXIES = ("lameduck", BASE, "haproxy")
TLS_LISTENER = "ingress-tls"
# Both servers are held to the same cipher suite (RFC 8446 §B.4): ChaCha20 beside AES-GCM on
# AES-NI would compare ciphers, not proxies. HAProxy is pinned with `ciphersuites` on its bind
# line; Python's ssl has no TLS 1.3 suite setter, so the pre-check (tls_cipher_problem) checks
# that lameduck negotiates the same suite with OpenSSL's default client (wrk is one).
TLS_CIPHERSUITE = "TLS_AES_256_GCM_SHA384"
TARGET_TLS_RATIO = 1.2
TARGET_TLS_LINE = (f"target (TLS): lameduck <= {TARGET_TLS_RATIO:g}x HAProxy's CPU µs per "
                   "keep-alive GET over TLS (same run, both saturated)")

# HTTP/3 (--h3): a lameduck of its own, with one TLS listener offering h2 by ALPN and serving
# HTTP/3 (QUIC, RFC 9000/9114) on the same port, loaded in turn by bench/h3load.py (Python: no
# C QUIC client runs here) and by h2load over TLS, in the same shape, under one CFS quota
# (--h3-quota), so that both figures are taken alike and lameduck is the limit of both while
# the load core has room (h2load + origin cost about what lameduck's HTTP/2 over TLS does per
# request; h3load less than lameduck's HTTP/3). No anchor speaks HTTP/3 here: no ratio.
H3_PROXIES = ("lameduck",)
H3_NAME = "lameduck-h3"
H3LOAD = REPO / "bench" / "h3load.py"
H3_SHAPE = ("5x10", 5, 10)  # (label, connections, concurrent streams per connection)
H3_PROTOCOLS = ("h3", "h2")
H3_QUOTA = 60  # --h3-quota's default, % of a core (see bench/README.md)
# A proxy capped by a CFS quota is saturated at this % of its quota (as --proxy-quota's).
QUOTA_SATURATED = 85.0

# The response-shape matrix (--shapes): keep-alive GETs through lameduck and HAProxy, measured
# in the HTTP/1.1 rounds, to origins answering in the shapes real origins send, one path each;
# and the floor relay (bench/floor_relay.py: uvloop + httptools, nothing else) against the
# keep-alive shape. Two listeners (lameduck) / frontends (HAProxy) of the same processes: one
# to the nginx shapes origin, one to the HAProxy origin of the `plain` shape.
SHAPES_PROXIES = ("lameduck", "haproxy")
FLOOR = "floor"
SHAPES_LISTENER, SHAPES_CLUSTER = "ingress-shapes", "origin-shapes"
PLAIN_LISTENER, PLAIN_CLUSTER = "ingress-plain", "origin-plain"
SHAPE_HELLO = b"hello\n"
SHAPE_16K = b"".join(b"%04d " % i + b"x" * 58 + b"\n" for i in range(256))  # 16,384 bytes
# The `30 fields` shape's add_header fields: with the 5 nginx always sends (Server, Date,
# Content-Type, Content-Length, Connection), 30 header fields in all. Values as a web
# application's answer carries them (no `$`: nginx would read a variable).
SHAPE_FIELDS = (
    ("Set-Cookie", "session=6f1c0a9e2b7d4c38a5e1f0b2d9c84a17; Path=/; HttpOnly; Secure; "
                   "SameSite=Lax"),
    ("Set-Cookie", "csrftoken=Zq3vX8kR1mN6pL0tY4wB7cD2fH9jS5aE; Path=/; Secure; SameSite=Strict"),
    ("Set-Cookie", "prefs=lang%3Den%26tz%3DUTC; Path=/; Max-Age=31536000"),
    ("Vary", "Accept-Encoding, Cookie"),
    ("Cache-Control", "private, no-cache, no-store, max-age=0, must-revalidate"),
    ("Pragma", "no-cache"),
    ("Expires", "Thu, 01 Jan 1970 00:00:00 GMT"),
    ("ETag", '"33a64df551425fcc55e4d42a148795d9f25f89d4"'),
    ("Last-Modified", "Wed, 21 Oct 2026 07:28:00 GMT"),
    ("Strict-Transport-Security", "max-age=63072000; includeSubDomains; preload"),
    ("Content-Security-Policy", "default-src 'self'; script-src 'self' https://cdn.example.com; "
                                "img-src 'self' data: https:; frame-ancestors 'none'"),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-XSS-Protection", "0"),
    ("Referrer-Policy", "strict-origin-when-cross-origin"),
    ("Permissions-Policy", "geolocation=(), microphone=(), camera=()"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Access-Control-Allow-Origin", "https://app.example.com"),
    ("Access-Control-Allow-Credentials", "true"),
    ("Access-Control-Expose-Headers", "X-Request-Id, X-RateLimit-Remaining"),
    ("X-Request-Id", "0f8fad5b-d9cb-469f-a165-70867728950e"),
    ("X-RateLimit-Limit", "1000"),
    ("X-RateLimit-Remaining", "998"),
    ("Server-Timing", "app;dur=12.3, db;dur=4.1, cache;desc=miss"),
)


@dataclass(frozen=True)
class Shape:
    """A response shape of the matrix: its row label, the path wrk asks for, which origin
    answers it (``plain``: the HAProxy origin; ``nginx``: the shapes origin), the body, and
    what the origin's raw answer must show (``wire_problems``)."""
    label: str
    path: str
    origin: str
    body: bytes
    connection: str | None  # the Connection header's value; None: no Connection header
    chunked: bool = False  # Transfer-Encoding: chunked (no Content-Length) or Content-Length
    fields: int = 0  # how many header fields, when it matters (0: not checked)


SHAPES = (
    Shape("plain", "/plain", "plain", SHAPE_HELLO, connection=None),
    Shape("keep-alive", "/keep-alive", "nginx", SHAPE_HELLO, connection="keep-alive"),
    Shape("chunked", "/chunked", "nginx", SHAPE_HELLO, connection="keep-alive", chunked=True),
    Shape("16k", "/16k", "nginx", SHAPE_16K, connection="keep-alive"),
    Shape("30 fields", "/30-fields", "nginx", SHAPE_HELLO, connection="keep-alive",
          fields=5 + len(SHAPE_FIELDS)),
)
FLOOR_SHAPE = SHAPES[1]  # the floor relay is measured against keep-alive


# --------------------------------------------------------------------------------------------
# Processes: started pinned, tracked, stopped by pid.
# --------------------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    """In the child before exec: own session (a terminal Ctrl-C reaches only run.py, which
    then stops everything itself) and SIGKILL if run.py dies without cleaning up."""
    os.setsid()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    admin_port: int = 0
    h2_port: int = 0  # where it serves h2c prior knowledge (0: not tested over HTTP/2)
    h2up_port: int = 0  # HTTP/1.1 listener whose upstream is the h2c origin (0: none)
    h2h2_port: int = 0  # h2c prior knowledge in front of the h2c origin (0: none)
    pool_port: int = 0  # HTTP/1.1 listener whose upstream is the pool of origins (0: none)
    shapes_port: int = 0  # HTTP/1.1 listener whose upstream is the nginx shapes origin
    plain_port: int = 0  # HTTP/1.1 listener whose upstream is the `plain` (HAProxy) origin
    tls_port: int = 0  # HTTPS listener whose upstream is the main origin (0: none)
    stats_socket: Path | None = None  # HAProxy's stats socket (for the pool's server counts)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty log)"


class CpuQuota:
    """``--proxy-quota``: each proxy in a cgroup of its own whose CFS quota is PCT % of a core.

    On a 2-core machine a fast proxy (HAProxy over h2c) outruns what one load core can send,
    so it idles at 75-80 % and its CPU per request is not a saturated figure. Capped, every
    proxy is the limit again (at >= 85 % of its quota) while the load core keeps headroom;
    CPU per request is still its CPU time over its requests. cgroup v1 (``cpu`` controller,
    ``cpu.cfs_quota_us``) or v2 (``cpu.max``)."""

    PERIOD_US = 100_000

    def __init__(self, pct: int) -> None:
        self.pct = pct
        v2 = Path("/sys/fs/cgroup")
        if "cpu" in _read(v2 / "cgroup.controllers").split():
            self.root, self.v2 = v2 / f"lameduck-bench-{os.getpid()}", True
        elif (Path("/sys/fs/cgroup/cpu") / "cpu.cfs_quota_us").exists():
            self.root, self.v2 = Path(f"/sys/fs/cgroup/cpu/lameduck-bench-{os.getpid()}"), False
        else:
            raise BenchError("--proxy-quota needs the cgroup cpu controller (v1 cpu.cfs_quota_us "
                             "or v2 cpu.max), writable: run as root")
        self.groups: list[Path] = []

    def group(self, name: str) -> Path:
        """A new cgroup with the quota; its cgroup.procs file is what a child joins by."""
        g = self.root / re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        g.mkdir(parents=True, exist_ok=True)
        quota = self.PERIOD_US * self.pct // 100
        if self.v2:
            if self.root not in self.groups:  # let the children use the controller
                (self.root / "cgroup.subtree_control").write_text("+cpu")
            (g / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        else:
            (g / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (g / "cpu.cfs_quota_us").write_text(str(quota))
        self.groups.append(g)
        return g / "cgroup.procs"

    def remove(self) -> None:
        """After every process is stopped (a cgroup with a member cannot be removed)."""
        for g in [*reversed(self.groups), self.root]:
            with contextlib.suppress(OSError):
                g.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class Procs:
    """Every process this run started, so that ``stop_all`` can end each one by its pid."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[Proc] = []
        self.quota: CpuQuota | None = None  # --proxy-quota: for what runs on quota_cpu
        self.quota_cpu = -1

    def start(self, name: str, cpu: int | str, argv: list[str],
              quota: CpuQuota | Literal[False] | None = None) -> Proc:
        """``cpu``: one CPU, or a taskset list ("0,1") for the rows spread over all cores.
        ``quota``: a CFS quota of its own for this process (the HTTP/3 part's ``--h3-quota``)
        instead of ``--proxy-quota``'s; False: none at all."""
        log = self.workdir / f"{name}.log"
        setup = _child_setup
        if quota is None and cpu == self.quota_cpu:
            quota = self.quota
        if quota:
            procs_file = quota.group(name)

            def setup() -> None:  # joins before exec: its forks (workers) are inside too
                _child_setup()
                procs_file.write_text(str(os.getpid()))
        with log.open("wb") as fh:
            popen = subprocess.Popen(
                ["taskset", "-c", str(cpu), *argv],  # taskset execs argv: same pid
                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                cwd=self.workdir, preexec_fn=setup,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def stop(self, proc: Proc, grace: float = 3.0) -> None:
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.popen.wait(timeout=5)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            try:
                self.stop(proc)
            except Exception as e:  # keep going: every other process must still be stopped
                print(f"bench: could not stop {proc.name} (pid {proc.pid}): {e}", file=sys.stderr)


class BenchError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 1.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_until(proc: Proc, what: str, check, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not proc.alive():
            raise BenchError(f"{proc.name} exited (code {proc.popen.returncode}) before {what}; "
                             f"log tail ({proc.log}):\n{proc.tail()}")
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(0.05)
    raise BenchError(f"{proc.name}: no {what} within {timeout:g}s; log tail ({proc.log}):\n"
                     f"{proc.tail()}")


# --------------------------------------------------------------------------------------------
# CPU accounting from /proc.
# --------------------------------------------------------------------------------------------

def _stat_fields(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2:].split()  # fields from 3 (state) on; comm may hold spaces


def _tree(root: int) -> list[int]:
    """``root`` and all its descendants (for proxies that fork workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                children.setdefault(int(_stat_fields(int(entry))[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def proc_ticks(pid: int) -> int:
    """utime + stime (clock ticks) of one process, all its threads, not its children."""
    f = _stat_fields(pid)
    return int(f[11]) + int(f[12])  # fields 14 and 15: utime, stime


def cpu_ticks(root: int) -> int:
    """utime + stime (clock ticks) of ``root`` and its descendants, all threads included."""
    total = 0
    for pid in _tree(root):
        with contextlib.suppress(OSError, IndexError, ValueError):  # gone meanwhile
            total += proc_ticks(pid)
    return total


def cpu_busy() -> dict[int, tuple[int, int]]:
    """Per CPU (busy, total) jiffies from /proc/stat, to see which side was saturated."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        m = re.match(r"cpu(\d+)\s+(.*)", line)
        if m:
            v = [int(x) for x in m.group(2).split()]
            idle = v[3] + v[4]  # idle + iowait
            out[int(m.group(1))] = (sum(v[:8]) - idle, sum(v[:8]))
    return out


def busy_pct(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
             cpus: Iterable[int]) -> dict[int, float]:
    """How busy (%) each of ``cpus`` was between two ``cpu_busy`` readings."""
    return {c: 100.0 * (after[c][0] - before[c][0]) / max(1, after[c][1] - before[c][1])
            for c in cpus}


# --------------------------------------------------------------------------------------------
# The origin and the three proxies.
# --------------------------------------------------------------------------------------------

def start_origin(procs: Procs, cpu: int, name: str = "origin") -> tuple[Proc, int]:
    return start_reporting(procs, name, cpu, [sys.executable, "-m", "lameduck.demo",
                                              "--port", "0"])


def start_floor(procs: Procs, cpu: int, upstream_port: int) -> tuple[Proc, int]:
    """The floor relay of the shape matrix (bench/floor_relay.py), pinned like the proxies."""
    return start_reporting(procs, FLOOR, cpu, [
        sys.executable, str(REPO / "bench" / "floor_relay.py"),
        "--upstream", f"127.0.0.1:{upstream_port}"])


def start_reporting(procs: Procs, name: str, cpu: int, argv: list[str]) -> tuple[Proc, int]:
    """A process that prints ``listening on 127.0.0.1:<port>`` once it accepts (the demo
    origin, the floor relay): started, and its port read from that line."""
    proc = procs.start(name, cpu, argv)
    port: list[int] = []

    def reported() -> bool:
        m = re.search(r"^listening on 127\.0\.0\.1:(\d+)$", proc.log.read_text(), re.M)
        if m:
            port.append(int(m.group(1)))
        return bool(m)

    wait_until(proc, "'listening on' line", reported, timeout=10)
    return proc, port[0]


def lameduck_bin() -> str:
    here = Path(sys.executable).parent / "lameduck"
    if here.exists():
        return str(here)
    venv = REPO / ".venv" / "bin" / "lameduck"
    if venv.exists():
        return str(venv)
    found = shutil.which("lameduck")
    if not found:
        raise BenchError("lameduck is not installed (run `make bench`, which installs it)")
    return found


def start_lameduck(procs: Procs, cpu: int | str, workdir: Path, origin_port: int,
                   h2: bool = False, h2up_origin_port: int = 0,
                   pool_origin_ports: tuple[int, ...] = (),
                   shapes_origin_port: int = 0, plain_origin_port: int = 0,
                   access_log: bool = False, workers: int = 1,
                   name: str | None = None, binary: str | None = None,
                   tls_files: tuple[Path, Path] | None = None, h3: bool = False,
                   quota: CpuQuota | Literal[False] | None = None) -> tuple[Proc, int]:
    """``workers`` > 1: lameduck's multi-process mode (a main process and that many worker
    processes, its children: pinned with it); ``name`` names its config, log and process;
    ``binary``: another lameduck executable (--lameduck-base), given the same config.
    ``shapes_origin_port``, ``plain_origin_port``: a listener (and cluster) for each, as the
    first one, for the response-shape matrix. ``tls_files`` (certificate, key): a TLS listener
    (ALPN http/1.1) to the first cluster, for the TLS rows; with ``h3`` it offers h2 and
    http/1.1 by ALPN and serves HTTP/3 on the same port (``http3: {}``), for the HTTP/3 part.
    ``quota``: its own CFS quota (``Procs.start``)."""
    port, admin = free_port(), free_port()
    tls_port = free_port() if tls_files else 0
    h2up_port = free_port() if h2up_origin_port else 0
    pool_port = free_port() if pool_origin_ports else 0
    shapes_port = free_port() if shapes_origin_port else 0
    plain_port = free_port() if plain_origin_port else 0
    cfg = {
        "admin": {"address": f"127.0.0.1:{admin}"},
        # Short drain so the SIGTERM at the end exits fast (no traffic is left by then anyway).
        "drain": {"time": "1s", "strategy": "gradual", "connection_grace": "200ms"},
        "shutdown": {"deadline": "2s", "min_drain": "0s", "stop_accepting": "at_drain_end"},
        "listeners": [{
            "name": "ingress",
            "address": f"127.0.0.1:{port}",
            "health_check_path": None,
            "idle_timeout": "60s",
            "routes": [{"prefix": "/", "cluster": "origin", "timeout": "30s"}],
        }],
        "clusters": [{"name": "origin", "endpoints": [f"127.0.0.1:{origin_port}"],
                      "connect_timeout": "5s", "max_idle_connections": 256,
                      "idle_timeout": "60s"}],
    }
    if h2up_origin_port:
        # HTTP/1.1 listener #2, its cluster reached over h2c: requests are streams on shared
        # connections (a second one opens only when H2UP_STREAMS are in flight on the first).
        cfg["listeners"].append({
            "name": H2UP_LISTENER,
            "address": f"127.0.0.1:{h2up_port}",
            "health_check_path": None,
            "idle_timeout": "60s",
            "routes": [{"prefix": "/", "cluster": H2UP_CLUSTER, "timeout": "30s"}],
        })
        cfg["clusters"].append({
            "name": H2UP_CLUSTER, "endpoints": [f"127.0.0.1:{h2up_origin_port}"],
            "protocol": "h2", "http2": {"max_concurrent_streams": H2UP_STREAMS},
            "connect_timeout": "5s", "max_idle_connections": 256, "idle_timeout": "60s",
        })
    if pool_origin_ports:
        # HTTP/1.1 listener #3, its cluster a pool of demo origins: round robin, active health
        # checks, outlier detection with its defaults, the default retry_policy.
        cfg["listeners"].append({
            "name": POOL_LISTENER,
            "address": f"127.0.0.1:{pool_port}",
            "health_check_path": None,
            "idle_timeout": "60s",
            "routes": [{"prefix": "/", "cluster": POOL_CLUSTER, "timeout": "30s"}],
        })
        cfg["clusters"].append({
            "name": POOL_CLUSTER, "endpoints": [f"127.0.0.1:{p}" for p in pool_origin_ports],
            "connect_timeout": "5s", "max_idle_connections": 256, "idle_timeout": "60s",
            "lb_policy": "round_robin", "health_check": dict(POOL_HEALTH_CHECK),
            "outlier_detection": {},
        })
    for listener, cluster, lport, oport in ((SHAPES_LISTENER, SHAPES_CLUSTER, shapes_port,
                                             shapes_origin_port),
                                            (PLAIN_LISTENER, PLAIN_CLUSTER, plain_port,
                                             plain_origin_port)):
        if oport:  # the response-shape matrix: the first listener and cluster, another origin
            cfg["listeners"].append({
                "name": listener,
                "address": f"127.0.0.1:{lport}",
                "health_check_path": None,
                "idle_timeout": "60s",
                "routes": [{"prefix": "/", "cluster": cluster, "timeout": "30s"}],
            })
            cfg["clusters"].append({"name": cluster, "endpoints": [f"127.0.0.1:{oport}"],
                                    "connect_timeout": "5s", "max_idle_connections": 256,
                                    "idle_timeout": "60s"})
    if tls_files:  # HTTPS in, the first cluster (plain HTTP/1.1 keep-alive) out
        cfg["listeners"].append({
            "name": TLS_LISTENER,
            "address": f"127.0.0.1:{tls_port}",
            "health_check_path": None,
            "idle_timeout": "60s",
            "tls": {"certificate": str(tls_files[0]), "key": str(tls_files[1]),
                    "alpn": ["h2", "http/1.1"] if h3 else ["http/1.1"]},
            **({"http3": {}} if h3 else {}),
            "routes": [{"prefix": "/", "cluster": "origin", "timeout": "30s"}],
        })
    if access_log:  # Envoy's default format, JSON off: the common case, written to a file
        cfg["listeners"][0]["access_log"] = {"path": str(workdir / "access.log")}
    if workers != 1:
        cfg["workers"] = workers
    name = name or ("lameduck-log" if access_log else "lameduck")
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    # Its log is its stderr (stdout too); both go to <name>.log in the work dir.
    proc = procs.start(name, cpu, [binary or lameduck_bin(), "run", "-c", str(path)],
                       quota=quota)
    try:
        wait_until(proc, "GET /ready == 200",
                   lambda: http_get(f"http://127.0.0.1:{admin}/ready")[0] == 200)
    except BaseException:
        # Not yet the caller's to stop: stop it here, with any worker it has started.
        stop_tree(procs, proc)
        raise
    proc.admin_port = admin
    if h2:
        proc.h2_port = port  # the same listener serves h2c prior knowledge, no config needed
    proc.h2up_port = h2up_port
    # its h2c-upstream listener takes h2c prior knowledge too: HTTP/2 in, HTTP/2 upstream
    proc.h2h2_port = h2up_port if h2 else 0
    proc.pool_port = pool_port
    proc.shapes_port, proc.plain_port = shapes_port, plain_port
    proc.tls_port = tls_port
    return proc, port


LAMEDUCK_STATS = re.compile(
    r"(downstream_(cx|rq)_total|upstream_(cx|rq)_total|upstream_cx_destroy\w*|connect_fail"
    r"|upstream_rq_(retry|timeout)\w*|rq_5xx|rq_4xx)$")
# Also, for the h2c upstream: connections opened over HTTP/2, GOAWAYs from the origin
# (close_notify), streams reset by it (rx_reset) or by lameduck (tx_reset).
LAMEDUCK_H2UP_STATS = re.compile(
    r"(upstream_cx_http2_total|upstream_cx_close_notify|upstream_rq_(rx|tx)_reset"
    r"|downstream_rq_2xx)$")
_H2UP_SCOPES = (f"http.{H2UP_LISTENER}.", f"cluster.{H2UP_CLUSTER}.")
# Also, for the pool: health checks, outlier ejections, requests answered 503 for want of a
# healthy endpoint, and the 2xx count.
LAMEDUCK_POOL_STATS = re.compile(
    r"(health_check\.(attempt|success|failure|network_failure)|ejections_enforced_total"
    r"|upstream_cx_none_healthy|upstream_rq_2xx|downstream_rq_2xx)$")
_POOL_SCOPES = (f"http.{POOL_LISTENER}.", f"cluster.{POOL_CLUSTER}.")
_TLS_SCOPES = (f"http.{TLS_LISTENER}.",)
_SHAPES_SCOPES = (f"http.{SHAPES_LISTENER}.", f"cluster.{SHAPES_CLUSTER}.",
                  f"http.{PLAIN_LISTENER}.", f"cluster.{PLAIN_CLUSTER}.")


def lameduck_admin(proc: Proc, path: str) -> dict:
    """GET ``path`` from lameduck's admin API: its JSON body, BenchError unless 200."""
    status, body = http_get(f"http://127.0.0.1:{proc.admin_port}{path}", timeout=5)
    if status != 200:
        raise BenchError(f"{proc.name} GET {path}: {status} {body[:200]!r}")
    return json.loads(body)


def lameduck_counters(proc: Proc, h2up: bool = False, pool: bool = False,
                      shapes: bool = False, tls: bool = False) -> dict[str, int]:
    """Connection and request counters from lameduck's admin API (pool churn, errors): those
    of the HTTP/1.1 rows' listener and cluster, with ``h2up`` those of the h2c upstream's, with
    ``pool`` those of the pool's, with ``shapes`` those of the shape matrix's, with ``tls``
    those of the TLS listener (its connections: one handshake each). Empty unless
    GET /stats answers 200."""
    try:
        stats = lameduck_admin(proc, "/stats?format=json")["stats"]
    except BenchError:
        return {}
    out = {}
    for st in stats:
        if "name" not in st:
            continue  # the histograms' element (Envoy's shape)
        name = st["name"]
        if h2up or pool or shapes or tls:
            if not name.startswith(_H2UP_SCOPES if h2up else _POOL_SCOPES if pool
                                   else _SHAPES_SCOPES if shapes else _TLS_SCOPES):
                continue
        elif name.startswith(_H2UP_SCOPES + _POOL_SCOPES + _SHAPES_SCOPES + _TLS_SCOPES):
            continue
        if (LAMEDUCK_STATS.search(name) or (h2up and LAMEDUCK_H2UP_STATS.search(name))
                or (pool and LAMEDUCK_POOL_STATS.search(name))):
            out[name] = st["value"]
    return out


def lameduck_pool_hosts(proc: Proc) -> list[dict]:
    """The pool cluster's endpoints from lameduck's GET /clusters?format=json: address,
    rq_total, rq_error, health_flags."""
    for c in lameduck_admin(proc, "/clusters?format=json")["cluster_statuses"]:
        if c["name"] == POOL_CLUSTER:
            return [{"address": h["address"], "rq_total": h["stats"]["rq_total"],
                     "rq_error": h["stats"]["rq_error"], "health": h["health_flags"]}
                    for h in c["host_statuses"]]
    raise BenchError(f"lameduck GET /clusters?format=json has no cluster {POOL_CLUSTER!r}")


def haproxy_pool_servers(proc: Proc) -> list[dict]:
    """The pool backend's servers from HAProxy's stats socket (``show stat``): name, address,
    hrsp_2xx (responses it answered 2xx), status and failed checks."""
    if proc.stats_socket is None:
        raise BenchError("haproxy has no stats socket")
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(proc.stats_socket))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    lines = data.decode(errors="replace").splitlines()
    if not lines or not lines[0].startswith("# "):
        raise BenchError(f"haproxy show stat: unexpected answer {data[:200]!r}")
    out = []
    for row in csv.DictReader([lines[0][2:], *lines[1:]]):
        if row.get("pxname") == POOL_HAPROXY_BACKEND and row.get("svname") not in (
                "BACKEND", "FRONTEND"):
            out.append({"name": row["svname"], "address": row.get("addr", "?"),
                        "hrsp_2xx": int(row.get("hrsp_2xx") or 0),
                        "status": row.get("status", "?"),
                        "chkfail": int(row.get("chkfail") or 0)})
    if not out:
        raise BenchError(f"haproxy show stat: no servers of backend {POOL_HAPROXY_BACKEND}")
    return out


HAPROXY_CFG = """\
# Generated by bench/run.py: HAProxy as a plain keep-alive HTTP/1.1 proxy, one thread, no logs.
global
    nbthread 1
    maxconn 4096
{stats_socket}
defaults
    mode http
    option http-keep-alive
    option forwardfor           # lameduck adds X-Forwarded-For too: same work
    http-reuse always
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-request 10s
    timeout http-keep-alive 60s

frontend fe
    bind 127.0.0.1:{port}
    default_backend origin
{h2_frontend}
backend origin
    server origin 127.0.0.1:{origin_port}
{h2up}{pool}{shapes}{tls}"""


HAPROXY_H2_FRONTEND = """
# h2c prior knowledge (h2load's default over http://), same backend over HTTP/1.1.
frontend fe_h2
    bind 127.0.0.1:{h2_port} proto h2
    default_backend origin
"""


HAPROXY_H2UP = """
# HTTP/1.1 clients, the h2c origin upstream (HTTP/2 prior knowledge, streams on reused
# connections); option forwardfor from the defaults, as for the other rows.
frontend fe_h2up
    bind 127.0.0.1:{h2up_port}
    default_backend origin_h2

backend origin_h2
    http-reuse always
    server s1 127.0.0.1:{h2up_origin_port} proto h2
"""


HAPROXY_H2H2 = """
# h2c prior knowledge clients, the same h2c origin backend (HTTP/2 on both sides).
frontend fe_h2h2
    bind 127.0.0.1:{h2h2_port} proto h2
    default_backend origin_h2
"""


HAPROXY_POOL = """
# HTTP/1.1 clients, a pool of demo origins: round robin, active health checks (GET /health
# every second, rise 2, fall 3), keep-alive and reuse as the other backends.
frontend fe_pool
    bind 127.0.0.1:{pool_port}
    default_backend {backend}

backend {backend}
    balance roundrobin
    option httpchk GET /health
    http-reuse always
{servers}"""

HAPROXY_TLS = """
# HTTPS in (certificate and key in one PEM, as `crt` wants them), the plain origin backend out;
# the TLS 1.3 suite pinned (HAProxy configuration manual, 5.1 `ciphersuites`).
frontend fe_tls
    bind 127.0.0.1:{tls_port} ssl crt {pem} alpn http/1.1 ciphersuites {suite}
    default_backend origin
"""


HAPROXY_SHAPES = """
# The response-shape matrix: a frontend per shape origin, each as the first one (keep-alive,
# reuse and forwardfor from the defaults).
frontend fe_{name}
    bind 127.0.0.1:{port}
    default_backend {name}

backend {name}
    server s1 127.0.0.1:{origin_port}
"""

# level operator: "show stat" then fills the servers' addr column.
HAPROXY_STATS_SOCKET = "    stats socket {path} mode 600 level operator  # pool server counts\n"


def start_haproxy(procs: Procs, cpu: int, workdir: Path, origin_port: int,
                  h2: bool = False, h2up_origin_port: int = 0,
                  pool_origin_ports: tuple[int, ...] = (), shapes_origin_port: int = 0,
                  plain_origin_port: int = 0, tls_pem: Path | None = None) -> tuple[Proc, int]:
    port = free_port()
    tls_port = free_port() if tls_pem else 0
    h2_port = free_port() if h2 else 0
    h2up_port = free_port() if h2up_origin_port else 0
    h2h2_port = free_port() if h2up_origin_port and h2 else 0
    pool_port = free_port() if pool_origin_ports else 0
    shapes_port = free_port() if shapes_origin_port else 0
    plain_port = free_port() if plain_origin_port else 0
    sock = workdir / "haproxy.sock" if pool_origin_ports else None
    servers = "".join(f"    server p{i} 127.0.0.1:{p} check inter 1s rise 2 fall 3\n"
                      for i, p in enumerate(pool_origin_ports, 1))
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(HAPROXY_CFG.format(
        port=port, origin_port=origin_port,
        stats_socket=HAPROXY_STATS_SOCKET.format(path=sock) if sock else "",
        h2_frontend=HAPROXY_H2_FRONTEND.format(h2_port=h2_port) if h2 else "",
        h2up=HAPROXY_H2UP.format(h2up_port=h2up_port, h2up_origin_port=h2up_origin_port)
        + (HAPROXY_H2H2.format(h2h2_port=h2h2_port) if h2h2_port else "")
        if h2up_origin_port else "",
        pool=HAPROXY_POOL.format(pool_port=pool_port, backend=POOL_HAPROXY_BACKEND,
                                 servers=servers) if pool_origin_ports else "",
        shapes="".join(HAPROXY_SHAPES.format(name=name, port=p, origin_port=o)
                       for name, p, o in (("shapes", shapes_port, shapes_origin_port),
                                          ("plain", plain_port, plain_origin_port)) if o),
        tls=HAPROXY_TLS.format(tls_port=tls_port, pem=tls_pem, suite=TLS_CIPHERSUITE)
        if tls_pem else ""))
    check = subprocess.run(["haproxy", "-c", "-q", "-f", str(cfg)], capture_output=True,
                           text=True)
    if check.returncode != 0:
        raise BenchError(f"haproxy rejected {cfg}:\n{check.stdout}{check.stderr}")
    proc = procs.start("haproxy", cpu, ["haproxy", "-f", str(cfg), "-db"])
    wait_until(proc, "listening socket", lambda: _proxied_ok(port))
    proc.h2_port = h2_port
    proc.h2up_port = h2up_port
    proc.h2h2_port = h2h2_port
    proc.pool_port = pool_port
    proc.shapes_port, proc.plain_port = shapes_port, plain_port
    proc.stats_socket = sock
    proc.tls_port = tls_port
    return proc, port


# What every nginx config starts with: no daemon, no access log, paths in {tmp}. One process
# (master off) except the --workers scale origin's, which needs a master to fork its workers.
NGINX_PREAMBLE = """\
worker_processes {processes};
daemon off;
master_process {master};
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    {temp_paths}
"""

NGINX_CFG = """\
# Generated by bench/run.py: nginx as a keep-alive HTTP/1.1 proxy, one process, no logs.
""" + NGINX_PREAMBLE + """\
    keepalive_timeout 60s;
    keepalive_requests 100000000;   # default 1000 would reconnect mid-round

    upstream origin {{
        server 127.0.0.1:{origin_port};
        keepalive 64;
        keepalive_requests 100000000;
        keepalive_timeout 60s;
    }}

    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;  # as lameduck does
            proxy_set_header X-Forwarded-Proto $scheme;
        }}
    }}
}}
"""


def _nginx_temp_paths(tmp: Path) -> str:
    """Temp paths inside ``tmp`` for every module compiled in (so nothing under /var)."""
    build = subprocess.run(["nginx", "-V"], capture_output=True, text=True).stderr
    lines = [f"client_body_temp_path {tmp}/client_body;", f"proxy_temp_path {tmp}/proxy;"]
    for mod in ("fastcgi", "uwsgi", "scgi"):
        if f"--without-http_{mod}_module" not in build:
            lines.append(f"{mod}_temp_path {tmp}/{mod};")
    return "\n    ".join(lines)


def start_nginx(procs: Procs, cpu: int, workdir: Path, origin_port: int) -> tuple[Proc, int]:
    port = free_port()
    tmp = workdir / "nginx"
    tmp.mkdir()
    cfg = tmp / "nginx.conf"
    cfg.write_text(NGINX_CFG.format(port=port, origin_port=origin_port, tmp=tmp,
                                    processes=1, master="off",
                                    temp_paths=_nginx_temp_paths(tmp)))
    return _run_nginx(procs, "nginx", cpu, tmp, cfg, port), port


def _run_nginx(procs: Procs, name: str, cpus: int | str, tmp: Path, cfg: Path,
               port: int, ready: Callable[[], bool] | None = None) -> Proc:
    """``cfg`` checked (nginx -t), then started; ready once ``ready()`` is true (default: it
    answers HELLO on ``port``). Stopped again if it never gets ready."""
    argv = ["nginx", "-p", str(tmp), "-e", str(tmp / "nginx-error.log"), "-c", str(cfg)]
    check = subprocess.run([*argv, "-t", "-q"], capture_output=True, text=True)
    if check.returncode != 0:
        raise BenchError(f"nginx rejected {cfg}:\n{check.stdout}{check.stderr}")
    proc = procs.start(name, cpus, argv)
    proc.log = tmp / "nginx-error.log"  # its stderr is empty: errors go to the error_log
    try:
        wait_until(proc, "listening socket", ready or (lambda: _proxied_ok(port)))
    except BenchError:
        procs.stop(proc)
        raise
    return proc


def _proxied_ok(port: int) -> bool:
    status, body = http_get(f"http://127.0.0.1:{port}/")
    return status == 200 and body == HELLO


# An nginx origin: the main and pool origins (--origin nginx), the h2c origin of the
# HTTP/2-upstream rows (listen ... http2) and the --workers scale origin (one process per CPU,
# master on). A fixed body from `return`, with the headers nginx always sends (Server, Date,
# Content-Length, Connection: keep-alive), as real origins answer; /health for the pool's
# health checks.
NGINX_ORIGIN_CFG = """\
# Generated by bench/run.py: nginx as the origin "{name}", no logs.
""" + NGINX_PREAMBLE + """\
    default_type text/plain;
    keepalive_timeout 60s;
    # The default of 1000 would reconnect the proxies' upstream connections mid-round; since
    # 1.19.7 it also caps the requests of an HTTP/2 connection (then GOAWAY).
    keepalive_requests 100000000;

    server {{
        listen 127.0.0.1:{port}{listen_opts};
        location / {{
            return 200 "{body}";
        }}
        location = /health {{
            return 200 "ok\\n";
        }}
    }}
}}
"""


def start_nginx_origin(procs: Procs, name: str, cpus: int | str, workdir: Path,
                       body: bytes = HELLO, processes: int = 1,
                       h2: bool = False) -> tuple[Proc, int]:
    """nginx answering ``body`` on ``GET /`` (and ``ok`` on ``/health``), pinned to ``cpus``.
    ``processes`` > 1: master on (nginx forks workers only then). ``h2``: HTTP/2 prior
    knowledge only (an HTTP/1.1 request gets the connection closed, so no proxy can fall back
    to HTTP/1.1 unnoticed), ready once curl --http2-prior-knowledge gets ``body``."""
    if h2:
        build = subprocess.run(["nginx", "-V"], capture_output=True, text=True).stderr
        if "--with-http_v2_module" not in build:
            raise BenchError("this nginx has no http_v2 module (nginx -V): no h2c origin")
    port = free_port()
    tmp = workdir / name
    tmp.mkdir(exist_ok=True)
    cfg = tmp / "nginx.conf"
    cfg.write_text(NGINX_ORIGIN_CFG.format(
        name=name, processes=processes, master="on" if processes > 1 else "off", port=port,
        tmp=tmp, temp_paths=_nginx_temp_paths(tmp), listen_opts=" http2" if h2 else "",
        body=body.decode().replace("\n", "\\n")))
    if not h2:
        return _run_nginx(procs, name, cpus, tmp, cfg, port), port

    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    proc = _run_nginx(procs, name, cpus, tmp, cfg, port, ready=listening)
    problem = h2c_check(procs, cpus, port, body)
    if problem:
        procs.stop(proc)
        raise BenchError(f"the nginx origin does not answer h2c prior knowledge on :{port}: "
                         f"{problem}; log tail ({proc.log}):\n{proc.tail()}")
    return proc, port


def start_h2_origin(procs: Procs, cpu: int, workdir: Path) -> tuple[Proc, int]:
    """The h2c origin of the HTTP/2-upstream rows, pinned like the other origins."""
    return start_nginx_origin(procs, "h2origin", cpu, workdir, body=H2_HELLO, h2=True)


def start_main_origin(procs: Procs, args: argparse.Namespace, workdir: Path,
                      name: str = "origin") -> tuple[Proc, int]:
    """The origin behind the HTTP/1.1 rows (and, named pool-originN, each pool origin):
    ``--origin nginx`` (one process, on the load CPU) or ``--origin demo`` (the Python demo
    origin, which sends no Connection header and saturates the load CPU first)."""
    if args.origin == "nginx":
        return start_nginx_origin(procs, name, args.load_cpu, workdir)
    return start_origin(procs, args.load_cpu, name)


def origin_headers(port: int) -> str:
    """What the origin answers ``GET /`` with (status and header names, Connection's and
    Server's values), to show in the results which origin the proxies were measured against."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
    try:
        conn.request("GET", "/")
        r = conn.getresponse()
        body = r.read()
        if r.status != 200 or body != HELLO:
            raise BenchError(f"the origin on :{port} answered {r.status} {body[:80]!r}")
        shown = [f"{k}: {v}" if k.lower() in ("connection", "server") else k
                 for k, v in r.getheaders()]
    except (OSError, http.client.HTTPException) as e:
        raise BenchError(f"the origin on :{port}: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
    if not any(h.lower().startswith("connection:") for h in shown):
        shown.append("(no Connection header)")
    return f"{r.status}, {len(body)}-byte body, headers " + ", ".join(shown)


# --------------------------------------------------------------------------------------------
# The response-shape matrix's origins, and what they send on the wire.
# --------------------------------------------------------------------------------------------

# One nginx process (as the main origin), a location per shape. /chunked: the sub module
# (sub_filter) clears the Content-Length of every response it filters, even when its string
# never occurs, so nginx frames the same body chunked (HTTP/1.1). /16k: a static file.
NGINX_SHAPES_CFG = """\
# Generated by bench/run.py: nginx as the origin of the response-shape matrix, no logs.
""" + NGINX_PREAMBLE + """\
    default_type text/plain;
    keepalive_timeout 60s;
    keepalive_requests 100000000;   # default 1000 would reconnect mid-round

    server {{
        listen 127.0.0.1:{port};
        location = /keep-alive {{
            return 200 "hello\\n";
        }}
{chunked}        location = /16k {{
            alias {tmp}/16k.txt;
        }}
        location = /30-fields {{
{fields}
            return 200 "hello\\n";
        }}
    }}
}}
"""

NGINX_SHAPES_CHUNKED = """\
        location = /chunked {
            sub_filter_types text/plain;
            sub_filter "never-in-the-body" "";
            return 200 "hello\\n";
        }
"""

# The `plain` shape: HTTP/1.1 keep-alive with no Connection header (it is the default there,
# RFC 9112 §9.3), which nginx cannot send. HAProxy answering by itself does: `http-request
# return` sends the status line, content-length and content-type (lower-case names) and the
# body, no Connection, Server or Date. One thread, pinned like the other origins.
PLAIN_ORIGIN_CFG = """\
# Generated by bench/run.py: HAProxy as the origin of the `plain` shape, one thread, no logs.
global
    nbthread 1
    maxconn 4096

defaults
    mode http
    option http-keep-alive
    timeout client 60s
    timeout http-request 10s
    timeout http-keep-alive 60s

frontend plain
    bind 127.0.0.1:{port}
    http-request return status 200 content-type text/plain string "hello\\n"
"""


def nginx_shapes_cfg(port: int, tmp: Path, temp_paths: str, chunked: bool = True) -> str:
    """The shapes origin's nginx.conf (``chunked``: with the /chunked location, which needs
    the sub module)."""
    fields = "\n".join(f"            add_header {name} {_nginx_quote(value)};"
                       for name, value in SHAPE_FIELDS)
    return NGINX_SHAPES_CFG.format(
        port=port, tmp=tmp, processes=1, master="off", temp_paths=temp_paths,
        chunked=NGINX_SHAPES_CHUNKED if chunked else "", fields=fields)


def _nginx_quote(value: str) -> str:
    if "$" in value:
        raise ValueError(f"{value!r}: nginx would read a variable")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def start_shapes_origin(procs: Procs, cpu: int, workdir: Path) -> tuple[Proc, int, bool]:
    """The nginx origin of the shape matrix: (process, port, whether it serves /chunked:
    only when nginx -V shows the sub module)."""
    build = subprocess.run(["nginx", "-V"], capture_output=True, text=True).stderr
    chunked = "--with-http_sub_module" in build
    port = free_port()
    tmp = workdir / "shapes-origin"
    tmp.mkdir(exist_ok=True)
    (tmp / "16k.txt").write_bytes(SHAPE_16K)
    cfg = tmp / "nginx.conf"
    cfg.write_text(nginx_shapes_cfg(port, tmp, _nginx_temp_paths(tmp), chunked))
    body = SHAPES[1].body

    def ready() -> bool:
        status, got = http_get(f"http://127.0.0.1:{port}{SHAPES[1].path}")
        return status == 200 and got == body

    return _run_nginx(procs, "shapes-origin", cpu, tmp, cfg, port, ready=ready), port, chunked


def start_plain_origin(procs: Procs, cpu: int, workdir: Path) -> tuple[Proc, int]:
    """HAProxy answering the `plain` shape itself (``http-request return``)."""
    port = free_port()
    tmp = workdir / "plain-origin"
    tmp.mkdir(exist_ok=True)
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(PLAIN_ORIGIN_CFG.format(port=port))
    check = subprocess.run(["haproxy", "-c", "-q", "-f", str(cfg)], capture_output=True,
                           text=True)
    if check.returncode != 0:
        raise BenchError(f"haproxy rejected {cfg}:\n{check.stdout}{check.stderr}")
    proc = procs.start("plain-origin", cpu, ["haproxy", "-f", str(cfg), "-db"])

    def ready() -> bool:
        return http_get(f"http://127.0.0.1:{port}{SHAPES[0].path}") == (200, SHAPES[0].body)

    try:
        wait_until(proc, "GET /plain == 200", ready)
    except BenchError:
        procs.stop(proc)
        raise
    return proc, port


@dataclass
class WireResponse:
    """One HTTP/1.1 response as it came off the socket."""
    status: int
    fields: list[tuple[str, str]]  # header fields in order, names as sent
    body: bytes  # chunked: the chunks' data joined
    chunked: bool
    size: int  # its bytes on the wire, head included

    def values(self, name: str) -> list[str]:
        return [v for n, v in self.fields if n.lower() == name.lower()]


def parse_wire_response(raw: bytes) -> WireResponse | None:
    """The HTTP/1.1 response at the start of ``raw``: None while it is incomplete. Framed by
    chunked transfer coding or Content-Length (RFC 9112 §6.3); a response framed by the
    connection's close, or malformed, is a BenchError (no keep-alive shape sends one)."""
    end = raw.find(b"\r\n\r\n")
    if end < 0:
        return None
    status_line, *lines = raw[:end].decode("latin-1").split("\r\n")
    m = re.fullmatch(r"HTTP/1\.1 (\d{3})(?: .*)?", status_line)
    if not m:
        raise BenchError(f"not an HTTP/1.1 status line: {status_line!r}")
    fields = []
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise BenchError(f"malformed header line {line!r}")
        fields.append((name, value.strip()))
    r = WireResponse(int(m.group(1)), fields, b"", False, 0)
    pos = end + 4
    if any("chunked" in v.lower() for v in r.values("Transfer-Encoding")):
        r.chunked = True
        chunks = []
        while True:
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                return None
            try:
                size = int(raw[pos:eol].split(b";")[0], 16)
            except ValueError:
                raise BenchError(f"bad chunk size line {raw[pos:eol][:40]!r}") from None
            pos = eol + 2
            if size == 0:
                if len(raw) < pos + 2:
                    return None
                if raw[pos:pos + 2] != b"\r\n":
                    raise BenchError("a trailer section after the last chunk (not expected)")
                pos += 2
                break
            if len(raw) < pos + size + 2:
                return None
            if raw[pos + size:pos + size + 2] != b"\r\n":
                raise BenchError(f"chunk of {size} bytes not followed by CRLF")
            chunks.append(raw[pos:pos + size])
            pos += size + 2
        r.body = b"".join(chunks)
    elif r.values("Content-Length"):
        length = int(r.values("Content-Length")[0])
        if len(raw) < pos + length:
            return None
        r.body, pos = raw[pos:pos + length], pos + length
    else:
        raise BenchError("neither Content-Length nor chunked: the body ends at the close")
    r.size = pos
    return r


def wire_get(port: int, path: str, requests: int = 2, timeout: float = 3.0,
             ) -> list[WireResponse]:
    """``requests`` GETs of ``path`` on one connection, over a raw socket: what the origin
    sends, byte for byte (http.client would hide the framing)."""
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        buf = b""
        for _ in range(requests):
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            while (r := parse_wire_response(buf)) is None:
                chunk = s.recv(65536)
                if not chunk:
                    raise BenchError(f"GET {path}: connection closed after {len(buf)} bytes "
                                     f"of response {len(out) + 1}")
                buf += chunk
            out.append(r)
            buf = buf[r.size:]
    return out


def wire_problems(shape: Shape, r: WireResponse) -> list[str]:
    """How the origin's answer differs from what ``shape`` stands for (none: it is that
    shape)."""
    problems = []
    if r.status != 200 or r.body != shape.body:
        problems.append(f"status {r.status}, {len(r.body)}-byte body {r.body[:40]!r}, "
                        f"expected 200 and {len(shape.body)} bytes {shape.body[:40]!r}")
    conn = r.values("Connection")
    if shape.connection is None and conn:
        problems.append(f"Connection: {', '.join(conn)} (expected no Connection header)")
    elif shape.connection is not None and [c.lower() for c in conn] != [shape.connection]:
        problems.append(f"Connection: {', '.join(conn) or '(none)'} "
                        f"(expected {shape.connection})")
    if shape.chunked != r.chunked:
        problems.append("Content-Length framing, expected chunked" if shape.chunked
                        else "chunked, expected Content-Length")
    if r.chunked and r.values("Content-Length"):
        problems.append("both chunked and Content-Length")
    if shape.fields and len(r.fields) != shape.fields:
        problems.append(f"{len(r.fields)} header fields, expected {shape.fields}")
    return problems


def wire_summary(r: WireResponse) -> str:
    """Status, body, framing and header names (the values of Connection, Server and
    Transfer-Encoding) as the origin sent them: the results say what each shape was."""
    shown = [f"{n}: {v}" if n.lower() in ("connection", "server", "transfer-encoding") else n
             for n, v in r.fields]
    if not r.values("Connection"):
        shown.append("(no Connection header)")
    framing = "chunked" if r.chunked else "Content-Length"
    return (f"{r.status}, {len(r.body)}-byte body ({framing}), {len(r.fields)} header fields: "
            + ", ".join(shown))


def shape_origin_check(port: int, shape: Shape) -> str:
    """Two GETs of the shape's path on one connection, raw: the summary of the first answer;
    BenchError unless both are that shape."""
    try:
        answers = wire_get(port, shape.path)
    except (OSError, ValueError) as e:
        raise BenchError(f"GET {shape.path}: {type(e).__name__}: {e}") from None
    for i, r in enumerate(answers, 1):
        problems = wire_problems(shape, r)
        if problems:
            raise BenchError(f"GET {shape.path} (request {i} on one connection): "
                             + "; ".join(problems))
    return wire_summary(answers[0])


def run_short(procs: Procs, cpu: int | str, name: str, argv: list[str],
              timeout: float) -> tuple[int | None, str]:
    """A short-lived tool (curl), tracked and stopped by pid like everything else; (exit code,
    or None when it had to be stopped, output)."""
    proc = procs.start(name, cpu, argv)
    try:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=timeout)
        rc = proc.popen.poll()
    finally:
        procs.stop(proc)
    return rc, proc.log.read_text(errors="replace")


def h2c_check(procs: Procs, cpu: int | str, port: int, expect: bytes) -> str | None:
    """``GET /`` with curl --http2-prior-knowledge: None when it was answered over HTTP/2 with
    200 and ``expect``, else what came back."""
    marker = "\n--curl: "
    rc, out = run_short(procs, cpu, "curl", [
        "curl", "-sS", "--http2-prior-knowledge", "--max-time", "3",
        "-w", marker + "%{http_version} %{http_code}", f"http://127.0.0.1:{port}/"], timeout=5)
    body, _, info = out.rpartition(marker)
    if rc == 0 and info.strip() == "2 200" and body.encode() == expect:
        return None
    return f"curl --http2-prior-knowledge: exit {rc}, {out.strip()[-200:]!r}"


def keepalive_check(port: int, requests: int = 3, timeout: float = 3.0,
                    expect: bytes = HELLO, path: str = "/", tls: bool = False) -> str | None:
    """Several GETs on one connection, as wrk sends them. None when all are answered with the
    origin's body on the same connection, else what went wrong: a proxy that stalls on the
    second request of a connection would otherwise show up only as a tiny req/s figure.
    ``tls``: over HTTPS (the bench's self-signed certificate is not verified)."""
    conn = (http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout,
                                        context=_client_context()) if tls
            else http.client.HTTPConnection("127.0.0.1", port, timeout=timeout))
    try:
        for i in range(1, requests + 1):
            try:
                conn.request("GET", path)
                r = conn.getresponse()
                body = r.read()
            except (OSError, http.client.HTTPException) as e:
                return f"request {i} on one keep-alive connection: {type(e).__name__}: {e}"
            if r.status != 200 or body != expect:
                return f"request {i} on one keep-alive connection: {r.status} {body[:80]!r}"
            if r.will_close:
                return f"request {i}: the proxy closed the keep-alive connection"
    finally:
        conn.close()
    return None


def _client_context() -> ssl.SSLContext:
    """OpenSSL's default client, as wrk's (no verification: the certificate is self-signed)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def make_tls_files(workdir: Path) -> tuple[Path, Path, Path]:
    """A throw-away self-signed P-256 certificate for 127.0.0.1 (openssl req -x509): its
    certificate and key files (lameduck's ``tls:``) and both in one PEM (HAProxy's ``crt``)."""
    cert, key, pem = workdir / "tls-cert.pem", workdir / "tls-key.pem", workdir / "tls.pem"
    argv = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchError(f"openssl req failed: {r.stderr.strip()}")
    pem.write_text(cert.read_text() + key.read_text())
    return cert, key, pem


def tls_negotiated(port: int, timeout: float = 3.0) -> str:
    """The protocol version and cipher suite OpenSSL's default client gets from ``port``."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw, \
            _client_context().wrap_socket(raw) as tls:
        cipher = tls.cipher()
        return f"{tls.version()} {cipher[0] if cipher else '?'}"


def tls_cipher_problem(negotiated: dict[str, str]) -> str | None:
    """None when every proxy negotiated the same TLS version and suite (``negotiated``: name ->
    "TLSv1.3 TLS_AES_256_GCM_SHA384"), else which did what: the CPU per request of different
    ciphers compares ciphers, not proxies."""
    if len(set(negotiated.values())) <= 1:
        return None
    return "different ciphers negotiated: " + ", ".join(
        f"{n} {v}" for n, v in sorted(negotiated.items()))


def cpu_ratio_verdict(m: dict[str, float], ha: dict[str, float], target: float) -> str:
    """lameduck's CPU µs per request over HAProxy's (``m``, ``ha``: their medians), against
    ``target``: judged only when both proxies were saturated (else the CPU of a proxy that
    waited on its load is diluted by idle wake-ups and says little)."""
    if not (saturated(m) and saturated(ha)) or not ha["cpu_us_per_req"]:
        return _not_saturated(m, ha).replace("no ratio:", "not judged:")
    ratio = m["cpu_us_per_req"] / ha["cpu_us_per_req"]
    return (f"{m['cpu_us_per_req']:.1f} vs {ha['cpu_us_per_req']:.1f} µs = {ratio:.2f}x "
            f"({'met' if ratio <= target else 'NOT met'}: <= {target:g}x)")


STARTERS = {"lameduck": start_lameduck,
            "lameduck-log": functools.partial(start_lameduck, access_log=True),
            "haproxy": start_haproxy, "nginx": start_nginx}


# --------------------------------------------------------------------------------------------
# wrk.
# --------------------------------------------------------------------------------------------

@dataclass
class Sample:
    proxy: str
    round: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_us_per_req: float
    proxy_cpu_pct: float
    cpu_pct: dict[int, float] = field(default_factory=dict)
    shape: str = ""  # the shape matrix's row ("" in the other parts)


_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(value: str, unit: str) -> float:
    return float(value) * _UNIT[unit]


def parse_wrk(out: str) -> dict[str, float]:
    def grab(pattern: str) -> re.Match:
        m = re.search(pattern, out, re.M)
        if not m:
            raise BenchError(f"unexpected wrk output (no match for {pattern!r}):\n{out}")
        return m

    lat = r"\s+([\d.]+)(us|ms|s|m)\s*$"
    p50 = grab(r"^\s*50(?:\.0+)?%" + lat)
    p99 = grab(r"^\s*99(?:\.0+)?%" + lat)
    errors = 0
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if sock:
        errors += sum(int(x) for x in sock.groups())
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        errors += int(non2xx.group(1))
    return {
        "requests": int(grab(r"^\s*(\d+) requests in")[1]),
        "rps": float(grab(r"^Requests/sec:\s+([\d.]+)")[1]),
        "p50_ms": _ms(*p50.groups()),
        "p99_ms": _ms(*p99.groups()),
        "errors": errors,
    }


def run_wrk(procs: Procs, cpu: int | str, port: int, seconds: float, conns: int,
            threads: int, path: str = "/", scheme: str = "http") -> str:
    """``scheme`` https: wrk over TLS, one handshake per connection, then keep-alive."""
    argv = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds:g}s", "--latency",
            f"{scheme}://127.0.0.1:{port}{path}"]
    proc = procs.start("wrk", cpu, argv)
    try:
        proc.popen.wait(timeout=seconds + 30)
    finally:
        procs.stop(proc)
    out = proc.log.read_text(errors="replace")
    if proc.popen.returncode != 0:
        raise BenchError(f"wrk failed (code {proc.popen.returncode}):\n{out}")
    return out


def measure(procs: Procs, name: str, proxy: Proc, port: int, args: argparse.Namespace,
            rnd: int, duration: float | None = None, shape: Shape | None = None,
            scheme: str = "http") -> Sample:
    """One wrk round against ``port`` (``shape``: GET its path, a row of the shape matrix)."""
    busy0, ticks0, t0 = cpu_busy(), cpu_ticks(proxy.pid), time.monotonic()
    out = run_wrk(procs, args.load_cpu, port, duration or args.duration, args.connections,
                  args.threads, shape.path if shape else "/", scheme)
    busy1, ticks1, wall = cpu_busy(), cpu_ticks(proxy.pid), time.monotonic() - t0
    if not proxy.alive():
        raise BenchError(f"{name} died during round {rnd}; log tail ({proxy.log}):\n"
                         f"{proxy.tail()}")
    w = parse_wrk(out)
    cpu_s = (ticks1 - ticks0) / CLK_TCK
    pct = busy_pct(busy0, busy1, (args.proxy_cpu, args.load_cpu))
    return Sample(
        proxy=name, round=rnd, requests=int(w["requests"]), rps=w["rps"],
        p50_ms=w["p50_ms"], p99_ms=w["p99_ms"], errors=int(w["errors"]),
        cpu_us_per_req=cpu_s * 1e6 / max(1, w["requests"]),
        proxy_cpu_pct=100.0 * cpu_s / wall, cpu_pct=pct, shape=shape.label if shape else "",
    )


# --------------------------------------------------------------------------------------------
# h2load (HTTP/2, h2c prior knowledge).
# --------------------------------------------------------------------------------------------

@dataclass
class H2Sample:
    proxy: str
    shape: str
    round: int
    requests: int = 0
    rps: float = 0.0
    mean_ms: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    errors: int = 0
    cpu_us_per_req: float = 0.0
    proxy_cpu_pct: float = 0.0
    cpu_pct: dict[int, float] = field(default_factory=dict)
    failed: str = ""  # why this round does not count (h2load's "requests:" line, ...); "" = ok


_H2_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}
_H2_DUR = r"([\d.]+)(us|ms|s)"
H2_MAIN_START = "Main benchmark duration is started"
H2_MAIN_END = "Main benchmark duration is over"


def parse_h2load(out: str) -> dict:
    """The summary of one h2load run. ``failed`` is "" when every request got a 2xx, else the
    reason (its "requests: ... succeeded, ... failed, ... errored" line, the status codes)."""
    r: dict = {"requests": 0, "rps": 0.0, "mean_ms": 0.0, "errors": 0, "failed": ""}
    req = re.search(r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                    r"(\d+) failed, (\d+) errored, (\d+) timeout", out, re.M)
    fin = re.search(r"^finished in " + _H2_DUR + r", ([\d.]+) req/s", out, re.M)
    if not req or not fin:
        lines = [ln for ln in out.strip().splitlines() if not ln.startswith("progress:")]
        r["failed"] = "no h2load summary: " + (" | ".join(lines[-4:]) or "(no output)")
        return r
    _total, _started, _done, ok, failed, errored, timeout = (int(x) for x in req.groups())
    codes = re.search(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out, re.M)
    non2xx = sum(int(x) for x in codes.groups()[1:]) if codes else 0
    lat = re.search(r"^time for request:\s+" + r"\s+".join([_H2_DUR] * 3), out, re.M)
    r["requests"] = ok
    r["rps"] = float(fin.group(3))
    if lat:
        r["mean_ms"] = float(lat.group(5)) * _H2_UNIT[lat.group(6)]
    r["errors"] = failed + errored + timeout + non2xx
    if r["errors"] or ok == 0:
        reason = req.group(0)
        if non2xx:
            reason += "; " + codes.group(0)
        traffic = re.search(r"^traffic: (\S+) \((\d+)\) total", out, re.M)
        if ok == 0 and traffic:  # tells "nothing came back" from "an answer h2load rejected"
            reason += f"; {traffic.group(2)} bytes received"
        r["failed"] = reason
    return r


def h2_percentiles(log_file: Path) -> tuple[float, float]:
    """p50 and p99 (ms, nearest rank) from h2load --log-file: start µs, status, duration µs per
    request of the measured period (warm-up requests are not in it)."""
    durations = []
    with contextlib.suppress(OSError), log_file.open() as fh:
        for line in fh:
            parts = line.split("\t")
            if len(parts) >= 3:
                with contextlib.suppress(ValueError):
                    durations.append(int(parts[2]))
    if not durations:
        return 0.0, 0.0
    durations.sort()
    n = len(durations)

    def rank(q: float) -> float:
        return durations[min(n - 1, max(0, math.ceil(q * n) - 1))] / 1000.0

    return rank(0.50), rank(0.99)


def run_h2load(procs: Procs, cpu: int, argv: list[str], timeout: float,
               on_line: dict[str, Callable[[], object]] | None = None) -> tuple[int | None, str]:
    """Runs h2load pinned to ``cpu``; (exit code or None if it had to be killed, output).
    ``on_line`` maps a phrase of its output to a callback, called once as soon as the phrase
    appears (h2load flushes its phase lines as they happen), to snapshot CPU counters there."""
    return run_phased(procs, cpu, "h2load", ["h2load", *argv], timeout, on_line)


def run_phased(procs: Procs, cpu: int, name: str, argv: list[str], timeout: float,
               on_line: dict[str, Callable[[], object]] | None = None,
               started: Callable[[Proc], object] | None = None) -> tuple[int | None, str]:
    """``run_h2load`` for any load tool that prints its phase lines as they happen (h2load,
    bench/h3load.py). ``started`` is given the tool's process as soon as it runs. The tool is
    reaped only after the last callback: one that exits right after its last phase line is
    still a zombie then, whose /proc/<pid>/stat keeps its CPU times."""
    proc = procs.start(name, cpu, argv)
    if started is not None:
        started(proc)
    pending = dict(on_line or {})
    end = time.monotonic() + timeout
    try:
        while True:
            exited = _exited(proc)
            if pending:
                text = proc.log.read_text(errors="replace")
                for phrase in [p for p in pending if p in text]:
                    pending.pop(phrase)()
            if exited or time.monotonic() >= end:
                break
            time.sleep(0.005 if pending else 0.05)
        rc = proc.popen.poll()
    finally:
        procs.stop(proc)
    return rc, proc.log.read_text(errors="replace")


def _exited(proc: Proc) -> bool:
    """Whether ``proc`` has exited, without reaping it (waitid WNOWAIT)."""
    if proc.popen.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped elsewhere
        return proc.popen.poll() is not None


def h2_precheck(procs: Procs, cpu: int, port: int) -> str | None:
    """A few requests over one h2c connection before the rounds: None if all got a 2xx, else
    why not (so a proxy without working HTTP/2 costs seconds, not every round's duration)."""
    rc, out = run_h2load(procs, cpu, ["-n", "20", "-c", "1", "-m", "4",
                                      f"http://127.0.0.1:{port}/"], timeout=10)
    if rc is None:
        return "h2c pre-check: no answer within 10 s (20 requests on one connection)"
    failed = parse_h2load(out)["failed"]
    return f"h2c pre-check: {failed}" if failed else None


def measure_h2(procs: Procs, name: str, proxy: Proc, shape: tuple[str, int, int],
               args: argparse.Namespace, rnd: int, workdir: Path) -> H2Sample:
    label, conns, streams = shape
    sample = H2Sample(proxy=name, shape=label, round=rnd)
    if not proxy.alive():
        sample.failed = f"{name} is not running (exit code {proxy.popen.returncode})"
        return sample
    log_file = workdir / f"h2load-{name}-{label}-{rnd}.tsv"
    argv = ["-t1", f"-c{conns}", f"-m{streams}", f"-D{round(args.h2_duration * 1000)}ms",
            *([f"--warm-up-time={round(args.h2_warmup * 1000)}ms"] if args.h2_warmup > 0
              else []),
            f"--log-file={log_file}",
            f"http://127.0.0.1:{proxy.h2h2_port if label == H2H2_SHAPE[0] else proxy.h2_port}/"]
    snaps: dict[str, tuple] = {}

    def snap(key: str):
        return lambda: snaps.setdefault(key, (cpu_busy(), cpu_ticks(proxy.pid),
                                               time.monotonic()))

    snap("start")()
    rc, out = run_h2load(procs, args.load_cpu, argv,
                         timeout=args.h2_warmup + args.h2_duration + 30,
                         on_line={H2_MAIN_START: snap("main"), H2_MAIN_END: snap("end")})
    snap("end")()  # no-op when the phase line was seen (the usual case)
    # Only the measured period: from h2load's "main duration started" to "over" (its warm-up
    # excluded, like its request count). Without those lines, the whole run.
    busy0, ticks0, t0 = snaps.get("main", snaps["start"])
    busy1, ticks1, t1 = snaps["end"]
    h = parse_h2load(out)
    if rc is None:
        h["failed"] = h["failed"] or f"h2load did not finish within its timeout; {out[-200:]!r}"
    elif rc != 0 and not h["failed"]:
        h["failed"] = f"h2load exited with code {rc}"
    if not proxy.alive():
        h["failed"] = (f"{name} exited during the round (code {proxy.popen.returncode}); "
                       + (h["failed"] or "h2load saw no error"))
    if log_file.exists():
        sample.p50_ms, sample.p99_ms = h2_percentiles(log_file)
        log_file.unlink()
    cpu_s = (ticks1 - ticks0) / CLK_TCK
    wall = max(1e-6, t1 - t0)
    sample.requests, sample.rps, sample.mean_ms = h["requests"], h["rps"], h["mean_ms"]
    sample.errors, sample.failed = h["errors"], h["failed"]
    sample.cpu_us_per_req = cpu_s * 1e6 / max(1, h["requests"])
    sample.proxy_cpu_pct = 100.0 * cpu_s / wall
    sample.cpu_pct = busy_pct(busy0, busy1, (args.proxy_cpu, args.load_cpu))
    return sample


# --------------------------------------------------------------------------------------------
# HTTP/3 (--h3): bench/h3load.py against a lameduck of its own, beside HTTP/2 over TLS
# (h2load) against the same listener, both under one CFS quota (--h3-quota).
# --------------------------------------------------------------------------------------------

def _load_h3load() -> ModuleType:
    """bench/h3load.py as a module (a script, not a package: loaded by its path) for its phase
    lines and its result line's parser."""
    spec = importlib.util.spec_from_file_location("lameduck_bench_h3load", H3LOAD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while being built
    spec.loader.exec_module(module)
    return module


h3load = _load_h3load()


@dataclass
class H3Sample:
    protocol: str  # "h3" (h3load over QUIC) or "h2" (h2load over TLS, ALPN h2)
    round: int
    requests: int = 0
    rps: float = 0.0
    errors: int = 0
    cpu_us_per_req: float = 0.0
    proxy_cpu_pct: float = 0.0
    client_us_per_req: float = 0.0  # the load tool's own CPU (/proc) over the same requests
    origin_us_per_req: float = 0.0  # the origin's, over the same requests
    cpu_pct: dict[int, float] = field(default_factory=dict)
    failed: str = ""  # why this round does not count; "" = ok


@dataclass
class H3Part:
    """What the HTTP/3 part measured: its rounds, the quota lameduck ran under (None: it could
    not be set, or 100: the whole core), the proxy CPU % at which lameduck counts as saturated,
    why nothing was measured (``failed``) or a protocol failed (``skipped``), and notes."""
    quota_pct: int | None
    saturated_at: float
    samples: list[H3Sample] = field(default_factory=list)
    failed: str = ""
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    client: str = ""  # h3load's first line: its QUIC stack and loop


def h3_client_argv(protocol: str, port: int, args: argparse.Namespace,
                   requests: int = 0) -> list[str]:
    """The load tool of ``protocol`` in the part's shape (H3_SHAPE) against the TLS listener's
    ``port``: h3load for "h3", h2load over TLS for "h2" (h2load offers h2 by ALPN and does not
    verify the certificate, as h3load). ``requests``: a fixed count on one connection with 4
    streams (the pre-check) instead of the measured duration and warm-up."""
    _, conns, streams = H3_SHAPE
    url = f"https://127.0.0.1:{port}/"
    if requests:
        shape, timing = ["-c1", "-m4", "-n", str(requests)], []
    else:
        shape = [f"-c{conns}", f"-m{streams}"]
        if protocol == "h3":
            timing = ["-D", f"{args.h3_duration:g}", *(
                ["--warm-up-time", f"{args.h3_warmup:g}"] if args.h3_warmup > 0 else [])]
        else:
            timing = [f"-D{round(args.h3_duration * 1000)}ms", *(
                [f"--warm-up-time={round(args.h3_warmup * 1000)}ms"] if args.h3_warmup > 0
                else [])]
    if protocol == "h3":
        return [sys.executable, str(H3LOAD), *shape, *timing, url]
    return ["h2load", "-t1", *shape, *timing, url]


def parse_h3load(out: str) -> dict:
    """h3load's result as ``parse_h2load`` gives h2load's: requests that got a 2xx, req/s,
    errors, and ``failed`` ("" when every request got a 2xx and at least one did)."""
    r: dict = {"requests": 0, "rps": 0.0, "mean_ms": 0.0, "errors": 0, "failed": ""}
    res = h3load.parse_result(out)
    if res is None:
        lines = [ln for ln in out.strip().splitlines() if ln.strip()]
        r["failed"] = "no h3load result: " + (" | ".join(lines[-4:]) or "(no output)")
        return r
    r["requests"], r["rps"], r["errors"] = res["requests"], res["rps"], res["errors"]
    if res["errors"] or not res["requests"]:
        r["failed"] = (f"h3load: {res['requests']} succeeded, {res['errors']} failed"
                       + (" (" + ", ".join(f"{k}: {v}" for k, v in res["statuses"].items())
                          + ")" if res["statuses"] else ""))
    return r


def h3_precheck(procs: Procs, cpu: int, port: int, protocol: str) -> tuple[str | None, str]:
    """20 requests on one connection before the rounds: (None if all got a 2xx, else why not,
    the tool's output). A protocol that does not work costs seconds, not every round."""
    tool = "h3load" if protocol == "h3" else "h2load"
    rc, out = run_phased(procs, cpu, tool, h3_client_argv(protocol, port, argparse.Namespace(),
                                                           requests=20), timeout=20)
    if rc is None:
        return (f"{protocol} pre-check: no answer within 20 s (20 requests on one connection)",
                out)
    failed = (parse_h3load if protocol == "h3" else parse_h2load)(out)["failed"]
    return (f"{protocol} pre-check: {failed}" if failed else None), out


def measure_h3(procs: Procs, proxy: Proc, protocol: str, args: argparse.Namespace,
               rnd: int, origin: Proc | None = None) -> H3Sample:
    """One round of one protocol: the client on the load core, lameduck's CPU (and the
    client's and the origin's) sampled at the client's phase lines, so only its measured
    period counts."""
    sample = H3Sample(protocol=protocol, round=rnd)
    if not proxy.alive():
        sample.failed = f"{proxy.name} is not running (exit code {proxy.popen.returncode})"
        return sample
    start, end = ((h3load.MAIN_STARTED, h3load.MAIN_OVER) if protocol == "h3"
                  else (H2_MAIN_START, H2_MAIN_END))
    client: list[Proc] = []
    snaps: dict[str, tuple] = {}

    def client_ticks() -> int:
        with contextlib.suppress(OSError, IndexError, ValueError):
            return proc_ticks(client[0].pid) if client else 0
        return 0

    def snap(key: str) -> Callable[[], object]:
        return lambda: snaps.setdefault(key, (
            cpu_busy(), cpu_ticks(proxy.pid), client_ticks(),
            cpu_ticks(origin.pid) if origin is not None else 0, time.monotonic()))

    snap("start")()
    tool = "h3load" if protocol == "h3" else "h2load"
    rc, out = run_phased(procs, args.load_cpu, tool, h3_client_argv(protocol, proxy.tls_port,
                                                                     args),
                         timeout=args.h3_warmup + args.h3_duration + 30,
                         on_line={start: snap("main"), end: snap("end")},
                         started=client.append)
    snap("end")()  # no-op when the phase line was seen (the usual case)
    busy0, ticks0, c0, o0, t0 = snaps.get("main", snaps["start"])
    busy1, ticks1, c1, o1, t1 = snaps["end"]
    h = (parse_h3load if protocol == "h3" else parse_h2load)(out)
    if rc is None:
        h["failed"] = h["failed"] or f"{tool} did not finish within its timeout; {out[-200:]!r}"
    elif rc != 0 and not h["failed"]:
        h["failed"] = f"{tool} exited with code {rc}"
    if not proxy.alive():
        h["failed"] = (f"{proxy.name} exited during the round (code {proxy.popen.returncode}); "
                       + (h["failed"] or f"{tool} saw no error"))
    wall = max(1e-6, t1 - t0)
    cpu_s = (ticks1 - ticks0) / CLK_TCK
    n = max(1, h["requests"])
    sample.requests, sample.rps, sample.errors = h["requests"], h["rps"], h["errors"]
    sample.failed = h["failed"]
    sample.cpu_us_per_req = cpu_s * 1e6 / n
    sample.proxy_cpu_pct = 100.0 * cpu_s / wall
    sample.client_us_per_req = (c1 - c0) / CLK_TCK * 1e6 / n
    sample.origin_us_per_req = (o1 - o0) / CLK_TCK * 1e6 / n
    sample.cpu_pct = busy_pct(busy0, busy1, (args.proxy_cpu, args.load_cpu))
    return sample


def h3_anchor_note() -> str:
    """Why the HTTP/3 row has no ratio: what here could serve HTTP/3 as an anchor, and does
    not (HAProxy's QUIC is a build option, as nginx's http_v3_module; h2load needs ngtcp2)."""
    def output(argv: list[str]) -> str:
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return r.stdout + r.stderr

    ha, ngx = output(["haproxy", "-vv"]), output(["nginx", "-V"])
    said = [
        "HAProxy " + ("has QUIC (+QUIC) but its HTTP/3 is not measured by this bench"
                      if "+QUIC" in ha else "is built without QUIC (haproxy -vv: -QUIC)"
                      if ha else "is not installed"),
        "nginx " + ("has http_v3_module but its HTTP/3 is not measured by this bench"
                    if "http_v3_module" in ngx else "has no http_v3_module (nginx -V)"
                    if ngx else "is not installed"),
        "h2load (nghttp2 without ngtcp2) speaks no QUIC",
    ]
    return ("no ratio and no target for HTTP/3: no HTTP/3 anchor runs on this machine ("
            + "; ".join(said) + ")")


def run_h3_part(procs: Procs, args: argparse.Namespace, workdir: Path, origin: Proc,
                origin_port: int, tls_files: tuple[Path, Path, Path]) -> H3Part:
    """A lameduck of its own (pinned to --proxy-cpu, in a cgroup capped at --h3-quota) with
    one TLS listener that offers h2 and serves HTTP/3 on the same port, to the origin of the
    HTTP/1.1 rows. A pre-check per protocol, then ``--rounds`` rounds, each measuring h3load
    (HTTP/3) and h2load (HTTP/2 over TLS) in the same shape, their order alternating. Never
    raises for a failure: it is in the result. The lameduck and its cgroup are gone after."""
    quota: CpuQuota | None = None
    notes: list[str] = []
    if args.h3_quota < 100:
        try:
            quota = CpuQuota(args.h3_quota)
        except BenchError as e:
            notes.append(f"--h3-quota {args.h3_quota} not applied ({e}): lameduck had its "
                         "whole core")
            print(f"bench: warning: {notes[-1]}", file=sys.stderr)
    pct = quota.pct if quota else None
    part = H3Part(quota_pct=pct if quota else (100 if args.h3_quota == 100 else None),
                  saturated_at=QUOTA_SATURATED * (pct or 100) / 100, notes=notes)
    proc = None
    try:
        try:
            proc, _ = start_lameduck(procs, args.proxy_cpu, workdir, origin_port,
                                     tls_files=(tls_files[0], tls_files[1]), h3=True,
                                     name=H3_NAME, quota=quota or False)  # not --proxy-quota
        except BenchError as e:
            part.failed = f"{H3_NAME} did not start: {e}"
            return part
        print(f"{H3_NAME}: pid {proc.pid}, TLS listener (h2, http/1.1 and HTTP/3) on "
              f"127.0.0.1:{proc.tls_port} (CPU {args.proxy_cpu}"
              + (f", CFS quota {pct}%" if pct else "") + ")", flush=True)
        problem = keepalive_check(proc.tls_port, tls=True)
        if problem:
            part.failed = f"HTTPS keep-alive pre-check: {problem}; log tail:\n{proc.tail(15)}"
            return part
        for protocol in H3_PROTOCOLS:
            problem, out = h3_precheck(procs, args.load_cpu, proc.tls_port, protocol)
            if protocol == "h3":  # its QUIC stack and loop, from its first line
                part.client = next((ln.removeprefix("h3load: ") for ln in out.splitlines()
                                    if ln.startswith("h3load: ") and ln.endswith(" loop")), "")
            if problem:
                part.skipped[protocol] = problem
                print(f"bench: warning: {H3_NAME} {problem}; skipping its {protocol} rounds\n"
                      f"log tail ({proc.log}):\n{proc.tail(15)}", file=sys.stderr)
        for rnd in range(1, args.rounds + 1):
            order = H3_PROTOCOLS if rnd % 2 else H3_PROTOCOLS[::-1]
            for protocol in order:
                if protocol in part.skipped:
                    continue
                s = measure_h3(procs, proc, protocol, args, rnd, origin)
                part.samples.append(s)
                if s.failed:
                    print(f"round {rnd} {protocol} {H3_NAME} FAILED: {s.failed}", flush=True)
                    if not proc.alive():
                        part.failed = s.failed + f"; log tail:\n{proc.tail()}"
                        return part
                    continue
                print(f"round {rnd} {protocol} {H3_SHAPE[0]} {H3_NAME} {s.rps:>8,.0f} req/s  "
                      f"{s.cpu_us_per_req:6.1f} µs/req  proxy CPU {s.proxy_cpu_pct:3.0f}%  "
                      f"cpu{args.load_cpu} {s.cpu_pct[args.load_cpu]:3.0f}%  client "
                      f"{s.client_us_per_req:6.1f} µs/req  origin {s.origin_us_per_req:5.1f} "
                      f"µs/req  errors {s.errors}", flush=True)
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, BenchError):
            stats = lameduck_admin(proc, "/stats?format=json")["stats"]
            scope = f"http.{TLS_LISTENER}."
            part.notes.append(f"{H3_NAME} counters of its listener after the rounds "
                              "(pre-checks and warm-ups included): " + ", ".join(
                                  f"{st['name']}={st['value']}" for st in stats
                                  if st.get("name", "").startswith(scope) and re.search(
                                      r"downstream_(cx|rq)_(http[23]_)?total$|rq_5xx$",
                                      st["name"])))
        return part
    finally:
        if proc is not None:
            stop_tree(procs, proc)
        if quota is not None:
            quota.remove()


def summarize_h3(part: H3Part, args: argparse.Namespace
                 ) -> tuple[list[list[str]], list[str], list[str]]:
    """The rows (one per protocol: medians over the rounds that worked), the lines under them
    (HTTP/3's CPU per request beside HTTP/2's, why there is no ratio, saturation) and one line
    per failed row."""
    rows, info, failures = [], [], []
    med: dict[str, dict[str, float]] = {}
    for protocol in H3_PROTOCOLS:
        client = "h3load (QUIC)" if protocol == "h3" else "h2load (TLS)"
        ss = [s for s in part.samples if s.protocol == protocol]
        bad = [s for s in ss if s.failed]
        why = part.skipped.get(protocol) or part.failed or (
            f"{len(bad)}/{len(ss)} rounds failed; round {bad[0].round}: {bad[0].failed}"
            if bad else "" if ss else "no rounds ran")
        if why:
            rows.append([protocol, client, "FAILED", *["-"] * 7,
                         str(sum(s.errors for s in ss)), "-"])
            failures.append(f"{H3_NAME} {protocol}: {why}")
            continue
        m = {k: statistics.median(getattr(s, k) for s in ss)
             for k in ("rps", "cpu_us_per_req", "proxy_cpu_pct", "client_us_per_req",
                       "origin_us_per_req")}
        m["load_pct"] = statistics.median(s.cpu_pct[args.load_cpu] for s in ss)
        med[protocol] = m
        rows.append([
            protocol, client, f"{m['rps']:,.0f}", f"{m['cpu_us_per_req']:.1f}",
            f"{m['proxy_cpu_pct']:.0f}%",
            f"{100 * m['proxy_cpu_pct'] / part.quota_pct:.0f}%" if part.quota_pct else "-",
            f"{m['load_pct']:.0f}%", f"{m['client_us_per_req']:.1f}",
            f"{m['origin_us_per_req']:.1f}", "none (no anchor)" if protocol == "h3" else "-",
            str(sum(s.errors for s in ss)),
            bound_by(m["proxy_cpu_pct"], m["load_pct"], args.load_cpu, part.saturated_at),
        ])
    honest = {p: m["proxy_cpu_pct"] >= part.saturated_at and m["load_pct"] < SATURATED
              for p, m in med.items()}
    if "h3" in med and "h2" in med:
        h3, h2 = med["h3"]["cpu_us_per_req"], med["h2"]["cpu_us_per_req"]
        info.append(f"lameduck CPU per request: HTTP/3 {h3:.1f} µs beside HTTP/2 over TLS "
                    f"{h2:.1f} µs, same quota, origin and shape (HTTP/3 = {h3 / h2:.2f}x "
                    "HTTP/2)"
                    + ("" if all(honest.values()) else
                       "; not both saturated with the load core free, see the limit column"))
    if med:
        need = {p: part.saturated_at * (m["client_us_per_req"] + m["origin_us_per_req"])
                / max(1e-9, m["cpu_us_per_req"]) for p, m in med.items()}
        info.append("the load core lameduck's saturation needs (client + origin µs/req x the "
                    f"req/s of lameduck at {part.saturated_at:g}% of a core): " + ", ".join(
                        f"{p} ~{v:.0f}%" for p, v in need.items())
                    + f"; the load core's own share only, under {SATURATED:g}% for an honest "
                    "figure (--h3-quota scales it)")
    for p, ok in honest.items():
        if not ok:
            m = med[p]
            info.append(f"{p}: not an honest figure: lameduck at {m['proxy_cpu_pct']:.0f}% of "
                        f"a core (saturated from {part.saturated_at:g}%), cpu{args.load_cpu} "
                        f"at {m['load_pct']:.0f}% (free below {SATURATED:g}%)"
                        + ("; the load core was busy: a lower --h3-quota leaves it more room "
                           "(unless other jobs took it)" if m["load_pct"] >= SATURATED else ""))
    info.append(h3_anchor_note())
    return rows, info, failures


H3_HEADERS = ["protocol", "client", "req/s (median)", "CPU µs/req", "proxy CPU", "of quota",
              "load CPU", "client µs/req", "origin µs/req", "vs HAProxy", "errors", "limit"]


def h3_title(part: H3Part, args: argparse.Namespace) -> str:
    _, conns, streams = H3_SHAPE
    quota = (f"lameduck capped at {part.quota_pct}% of CPU {args.proxy_cpu}"
             if part.quota_pct and part.quota_pct < 100 else
             f"lameduck uncapped on CPU {args.proxy_cpu}")
    return (f"HTTP/3 beside HTTP/2 over TLS, one lameduck ({quota}; -c{conns} -m{streams}; "
            f"{args.h3_duration:g} s rounds; origin: {args.origin})")


def print_h3(part: H3Part, args: argparse.Namespace) -> tuple[list[list[str]], list[str],
                                                                  list[str]]:
    rows, info, failures = summarize_h3(part, args)
    print()
    print(h3_title(part, args))
    print(text_table(rows, H3_HEADERS, left=2))
    print()
    print(f"no target for HTTP/3 (informational); h3load: {part.client or '?'}:")
    for x in info:
        print("  " + x)
    for f in failures:
        print("  failed: " + f)
    for n in part.notes:
        print("note: " + n)
    return rows, info, failures


def h3_markdown(part: H3Part, summary: tuple[list[list[str]], list[str], list[str]],
                args: argparse.Namespace) -> list[str]:
    rows, info, failures = summary
    _, conns, streams = H3_SHAPE
    warm = f" (after a {args.h3_warmup:g} s warm-up)" if args.h3_warmup > 0 else ""
    rounds = [[str(s.round), s.protocol, "FAILED" if s.failed else f"{s.rps:,.0f}",
               f"{s.cpu_us_per_req:.1f}", f"{s.proxy_cpu_pct:.0f}%",
               f"{s.cpu_pct.get(args.load_cpu, 0):.0f}%", f"{s.client_us_per_req:.1f}",
               f"{s.origin_us_per_req:.1f}", str(s.errors)] for s in part.samples]
    return [
        "## HTTP/3 beside HTTP/2 over TLS",
        "",
        f"{h3_title(part, args)}. A lameduck of its own with one TLS listener (`alpn: [h2, "
        "http/1.1]`, `http3: {}`: QUIC on the same port) to the first table's origin; each "
        f"round runs bench/h3load.py ({part.client or '?'}) over HTTP/3 and h2load over "
        f"HTTP/2 (TLS, ALPN h2), both -c{conns} -m{streams}, {args.h3_duration:g} s{warm}, on "
        f"CPU {args.load_cpu}, their order alternating. lameduck counts as saturated at >= "
        f"{part.saturated_at:g}% of a core (85% of its quota); a figure is honest when it is "
        f"and the load core is under {SATURATED:g}%. *client µs/req* and *origin µs/req* are "
        "the load tool's own CPU and the origin's over the same requests: what the load core "
        "pays per request.",
        "",
        md_table(rows, H3_HEADERS),
        "",
        *[f"- {x}" for x in info],
        *[f"- failed: {f}" for f in failures],
        "",
        *[f"Note: {n}.\n" for n in part.notes],
        "### HTTP/3 rounds",
        "",
        md_table(rounds, ["round", "protocol", "req/s", "CPU µs/req", "proxy CPU",
                          f"cpu{args.load_cpu} busy", "client µs/req", "origin µs/req",
                          "errors"]),
        "",
    ]


# --------------------------------------------------------------------------------------------
# Report.
# --------------------------------------------------------------------------------------------

def lameduck_build(binary: str) -> str:
    """Version, commit and whether the hot path is compiled, of the lameduck behind ``binary``:
    a before/after comparison means little unless both builds are compiled alike."""
    probe = ("import lameduck, lameduck.http1.wire as w; "
             "print(lameduck.__version__); print(w.__file__)")
    try:
        r = subprocess.run([str(Path(binary).parent / "python"), "-c", probe],
                           capture_output=True, text=True, timeout=60)
        version, module = r.stdout.split()
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return f"? ({binary})"
    hot = "hot path compiled" if module.endswith(".so") else "pure-Python hot path"
    repo = Path(module).resolve().parents[3]  # <repo>/src/lameduck/http1/wire...
    # --no-optional-locks: only read (another process may be using the same work tree)
    git = ["git", "--no-optional-locks", "-C", str(repo)]
    commit = ""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0:
            commit = f"commit {head.stdout.strip()}"
            changed = subprocess.run([*git, "status", "--porcelain", "--", "src"],
                                     capture_output=True, text=True, timeout=10).stdout
            if changed.strip():
                commit += " + uncommitted changes in src/"
            commit += ", "
    return f"{version}, {commit}{hot} ({binary})"


def _versions(args: argparse.Namespace) -> dict[str, str]:
    def first_line(argv: list[str]) -> str:
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return "?"
        return ((r.stdout or r.stderr).strip().splitlines() or ["?"])[0]

    cpu = "?"
    with contextlib.suppress(OSError):
        m = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = m.group(1) if m else "?"
    return {
        "lameduck": args.builds.get("lameduck", "-"),
        **({BASE: args.builds[BASE]} if BASE in args.builds else {}),
        "python": platform.python_version(),
        "haproxy": first_line(["haproxy", "-v"]),
        "nginx": first_line(["nginx", "-v"]),
        "wrk": first_line(["wrk", "--version"]),
        "h2load": first_line(["h2load", "--version"]) if shutil.which("h2load") else "-",
        "kernel": platform.release(),
        "cpu": f"{cpu} x {os.cpu_count()}",
    }


def bound_by(proxy_pct: float, load_pct: float, load_cpu: int,
             proxy_saturated: float | None = None) -> str:
    """Which side limited the round: the proxy (at >= PROXY_SATURATED % of its core, or
    ``proxy_saturated`` for a part with a quota of its own), the load core (origin + client at
    >= SATURATED % busy), both, or neither (latency, other jobs)."""
    at = PROXY_SATURATED if proxy_saturated is None else proxy_saturated
    sides = [n for n, hit in (("proxy", proxy_pct >= at),
                              (f"cpu{load_cpu} (load)", load_pct >= SATURATED)) if hit]
    return " + ".join(sides) or "neither"


def saturated(m: dict[str, float]) -> bool:
    """Whether the proxy of a row (its medians) was the limit: only then does its req/s say
    what it can do, and a req/s ratio mean anything."""
    return m["proxy_cpu_pct"] >= PROXY_SATURATED


def rps_ratio(a: dict[str, float], b: dict[str, float]) -> float | None:
    """``a``'s req/s over ``b``'s: only when both proxies were the limit of their rows (and
    ``b`` served any); None stands for "n/s". Every req/s ratio the bench prints is this one."""
    if not (saturated(a) and saturated(b)) or not b["rps"]:
        return None
    return a["rps"] / b["rps"]


def change(new: float, old: float) -> str:
    """``new`` against ``old`` as a signed percentage ("n/a" where ``old`` is 0: a row that
    used no measurable CPU)."""
    return f"{new / old - 1:+.1%}" if old else "n/a"


def ratio_cell(m: dict[str, float], ha: dict[str, float] | None) -> str:
    """req/s over HAProxy's: "n/a" without an HAProxy row, "n/s" (not saturated) unless both
    proxies were the limit of their rows."""
    if ha is None:
        return "n/a"
    ratio = rps_ratio(m, ha)
    return "n/s" if ratio is None else f"{ratio:.2f}x"


def saturation_notes(med: dict[str, dict[str, float]], has_ha: bool) -> list[str]:
    """The footnote of a table with a row whose proxy was not saturated (none otherwise)."""
    low = {n: m for n, m in med.items() if not saturated(m)}
    if not low:
        return []
    who = ", ".join(f"{n} {m['proxy_cpu_pct']:.0f}%" for n, m in low.items())
    text = (f"n/s = not saturated: {who} proxy CPU, under {PROXY_SATURATED:g}% of a core: not "
            "the limit (see *limit*), so that req/s is what the rest of the setup allowed")
    if has_ha:
        text += (" and no ratio to HAProxy is printed for it"
                 + (" (HAProxy among them: for no row)" if "haproxy" in low else ""))
    return [text + "; compare CPU µs/req"]


def base_notes(samples: list[Sample] | list[H2Sample], med: dict[str, dict[str, float]],
               label: str = "") -> list[str]:
    """lameduck next to lameduck-base (--lameduck-base) measured in the same rounds: CPU
    µs/request, with the round-by-round change (each round ran both back to back), and req/s
    when both were saturated."""
    if BASE not in med or "lameduck" not in med:
        return []
    new, old = med["lameduck"], med[BASE]
    by_round: dict[str, dict[int, float]] = {"lameduck": {}, BASE: {}}
    for s in samples:
        if s.proxy in by_round and not getattr(s, "failed", ""):
            by_round[s.proxy][s.round] = s.cpu_us_per_req
    paired = [change(by_round["lameduck"][r], b) for r, b in sorted(by_round[BASE].items())
              if r in by_round["lameduck"]]
    ratio = rps_ratio(new, old)
    return [f"{label}lameduck vs {BASE} (same config, same rounds): CPU "
            f"{new['cpu_us_per_req']:.1f} vs {old['cpu_us_per_req']:.1f} µs/req "
            f"({change(new['cpu_us_per_req'], old['cpu_us_per_req'])}"
            + (f"; round by round {', '.join(paired)}" if paired else "")
            + f"); req/s {new['rps']:,.0f} vs {old['rps']:,.0f} "
            + ("(n/s: no ratio, one of them was not saturated)" if ratio is None
               else f"({ratio:.2f}x)")]


def _medians(ss: list[Sample], load_cpu: int) -> dict[str, float]:
    """The medians of a row's rounds, the load core's busy % included (to name the limit)."""
    m = {k: statistics.median(getattr(s, k) for s in ss)
         for k in ("rps", "p50_ms", "p99_ms", "cpu_us_per_req", "proxy_cpu_pct")}
    m["errors"] = sum(s.errors for s in ss)
    m["load_pct"] = statistics.median(s.cpu_pct[load_cpu] for s in ss)
    return m


@dataclass
class Summary:
    """A wrk table: its rows, the target verdict lines, the footnotes (saturation, the
    lameduck-base comparison) and the medians by proxy."""
    rows: list[list[str]]
    verdict: list[str]
    notes: list[str]
    med: dict[str, dict[str, float]]


def summarize(samples: list[Sample], names: list[str], load_cpu: int) -> Summary:
    med = {n: _medians([s for s in samples if s.proxy == n], load_cpu) for n in names}
    ha = med.get("haproxy")
    rows = []
    for n in names:
        m = med[n]
        rows.append([
            n, f"{m['rps']:,.0f}", f"{m['p50_ms']:.2f} ms", f"{m['p99_ms']:.2f} ms",
            f"{m['cpu_us_per_req']:.1f}", f"{m['proxy_cpu_pct']:.0f}%", f"{m['load_pct']:.0f}%",
            ratio_cell(m, ha), str(int(m["errors"])),
            bound_by(m["proxy_cpu_pct"], m["load_pct"], load_cpu),
        ])
    verdict = []
    if "lameduck" in med:
        cpu = med["lameduck"]["cpu_us_per_req"]
        verdict.append(f"lameduck CPU per request: {cpu:.1f} µs "
                       f"({'met' if cpu <= TARGET_CPU_US else 'NOT met'}: <= {TARGET_CPU_US:g})")
        if ha:
            verdict.append("lameduck req/s vs HAProxy: " + _ratio_verdict(
                med["lameduck"], ha, TARGET_RATIO))
    return Summary(rows, verdict, [*saturation_notes(med, ha is not None),
                                   *base_notes(samples, med)], med)


def _not_saturated(m: dict[str, float], ha: dict[str, float]) -> str:
    """"" when lameduck's row (``m``) and HAProxy's (``ha``) were both saturated, else the
    "n/s" text that stands in for their req/s ratio."""
    low = " and ".join(f"{n} at {x['proxy_cpu_pct']:.0f}%" for n, x in
                       (("lameduck", m), ("haproxy", ha)) if not saturated(x))
    return (f"n/s (no ratio: {low} proxy CPU, under {PROXY_SATURATED:g}%, was not the limit)"
            if low else "")


def _ratio_verdict(m: dict[str, float], ha: dict[str, float], target: float) -> str:
    """The req/s ratio target: judged only when both proxies were saturated."""
    ratio = rps_ratio(m, ha)
    if ratio is None:
        return _not_saturated(m, ha).replace("no ratio:", "not judged:")
    return f"{ratio:.2f}x ({'met' if ratio >= target else 'NOT met'}: >= {target:g}x)"


def summarize_h2(samples: list[H2Sample], names: list[str], load_cpu: int,
                 skipped: dict[str, str],
                 ) -> tuple[list[list[str]], list[str], list[str], list[str]]:
    """Rows (shape x proxy, medians over the rounds that worked), the HTTP/2 verdict, one
    line per failed row with its reason, and the footnotes (saturation, lameduck-base). A row
    fails when any of its rounds failed."""
    rows, verdict, failures, notes = [], [], [], []
    shapes = [*H2_SHAPES, *([H2H2_SHAPE] if any(s.shape == H2H2_SHAPE[0] for s in samples)
                            else [])]
    for label, _, _ in shapes:
        med: dict[str, dict[str, float]] = {}
        failed: dict[str, str] = {}
        for n in names:
            ss = [s for s in samples if s.proxy == n and s.shape == label]
            bad = [s for s in ss if s.failed]
            if n in skipped and not ss:
                failed[n] = skipped[n]
            elif bad or not ss:
                first = bad[0] if bad else None
                failed[n] = (f"{len(bad)}/{len(ss)} rounds failed; round {first.round}: "
                             f"{first.failed}" if first else "no rounds ran")
            good = [s for s in ss if not s.failed]
            if good:
                med[n] = {k: statistics.median(getattr(s, k) for s in good)
                          for k in ("rps", "mean_ms", "p50_ms", "p99_ms", "cpu_us_per_req",
                                    "proxy_cpu_pct")}
                med[n]["load_pct"] = statistics.median(s.cpu_pct[load_cpu] for s in good)
            errors = sum(s.errors for s in ss)
            if n in failed:
                rows.append([label, n, "FAILED", "-", "-", "-", "-", "-", "-", "-",
                             str(errors), "-"])
                failures.append(f"{n} h2 {label}: {failed[n]}")
        ha = med.get("haproxy") if "haproxy" not in failed else None
        ok = {n: m for n, m in med.items() if n not in failed}
        for n, m in ok.items():
            rows.append([
                label, n, f"{m['rps']:,.0f}", f"{m['mean_ms']:.2f} ms", f"{m['p50_ms']:.2f} ms",
                f"{m['p99_ms']:.2f} ms", f"{m['cpu_us_per_req']:.1f}",
                f"{m['proxy_cpu_pct']:.0f}%", f"{m['load_pct']:.0f}%", ratio_cell(m, ha),
                str(sum(s.errors for s in samples if s.proxy == n and s.shape == label)),
                bound_by(m["proxy_cpu_pct"], m["load_pct"], load_cpu),
            ])
        notes += [f"{label}: {x}" for x in saturation_notes(ok, ha is not None)]
        notes += base_notes([s for s in samples if s.shape == label], ok, f"{label}: ")
        if "lameduck" not in names or label == H2H2_SHAPE[0]:
            continue  # no target for the HTTP/2-upstream shape: its row is for information
        if "lameduck" in failed:
            verdict.append(f"h2 {label}: NOT met (lameduck failed, see below)")
            continue
        cpu = med["lameduck"]["cpu_us_per_req"]
        parts = [f"CPU {cpu:.1f} µs/req ({'met' if cpu <= TARGET_H2_CPU_US else 'NOT met'}: "
                 f"<= {TARGET_H2_CPU_US:g})"]
        if ha:
            parts.append("req/s vs HAProxy " + _ratio_verdict(med["lameduck"], ha,
                                                              TARGET_H2_RATIO))
        else:
            parts.append("req/s vs HAProxy: n/a (no HAProxy h2 result)")
        verdict.append(f"h2 {label}: lameduck " + ", ".join(parts))
    # Order: shape by shape, proxies in --proxies order (failed rows are listed in place).
    order = {n: i for i, n in enumerate(names)}
    shape_order = {label: i for i, (label, _, _) in enumerate(shapes)}
    rows.sort(key=lambda r: (shape_order[r[0]], order[r[1]]))
    return rows, verdict, failures, notes


def _median(ss: list[Sample] | list[WorkerSample], key: str,
            proxy: str | None = None) -> float | None:
    """The median of ``key`` over ``ss`` (only the samples of ``proxy`` when given); None when
    there are none."""
    vals = [getattr(s, key) for s in ss if proxy is None or s.proxy == proxy]
    return statistics.median(vals) if vals else None


def _side_rows(samples: list[Sample], names: list[str], load_cpu: int,
               skipped: dict[str, str], part: str,
               ) -> tuple[list[str], Summary, list[list[str]], list[str]]:
    """Rows of a part measured like the HTTP/1.1 one (same columns; a proxy in ``skipped``
    reads FAILED): (proxies with rounds, their summary, all rows, one line per failure)."""
    good = [n for n in names if n not in skipped and any(s.proxy == n for s in samples)]
    summary = summarize(samples, good, load_cpu)
    by_name = dict(zip(good, summary.rows, strict=True))
    rows, failures = [], []
    for n in names:
        if n in by_name:
            rows.append(by_name[n])
            continue
        errors = sum(s.errors for s in samples if s.proxy == n)
        rows.append([n, "FAILED", "-", "-", "-", "-", "-", "-", str(errors), "-"])
        failures.append(f"{n} {part}: {skipped.get(n, 'no rounds ran')}")
    return good, summary, rows, failures


def _ratio_info(summary: Summary, what: str) -> list[str]:
    """lameduck's req/s ratio to HAProxy in a part with no target, under the same rule."""
    med = summary.med
    if "lameduck" not in med or "haproxy" not in med:
        return []
    m, ha = med["lameduck"], med["haproxy"]
    ratio = rps_ratio(m, ha)
    return [f"lameduck req/s vs HAProxy {what}: "
            + (_not_saturated(m, ha) if ratio is None else f"{ratio:.2f}x")]


def summarize_h2up(samples: list[Sample], names: list[str], load_cpu: int,
                   skipped: dict[str, str], h1_samples: list[Sample],
                   ) -> tuple[list[list[str]], list[str], list[str]]:
    """The HTTP/2-upstream rows, informational lines (no target: what the h2c upstream costs
    next to the same proxy's HTTP/1.1-upstream row of this run; the footnotes) and one line per
    failed row."""
    good, summary, rows, failures = _side_rows(samples, names, load_cpu, skipped,
                                               "h2-upstream")
    info = []
    for n in good:
        cpu, h1 = _median(samples, "cpu_us_per_req", n), _median(h1_samples, "cpu_us_per_req", n)
        line = f"{n}: {cpu:.1f} µs CPU/request with the h2c upstream"
        if h1 is not None:
            line += (f", {h1:.1f} with the HTTP/1.1 upstream in this run's first table "
                     f"({cpu - h1:+.1f} µs, {cpu / h1:.2f}x)" if h1 else "")
        info.append(line)
    info += _ratio_info(summary, "with an h2c upstream")
    return rows, [*info, *summary.notes], failures


def summarize_tls(samples: list[Sample], names: list[str], load_cpu: int,
                  skipped: dict[str, str], h1_samples: list[Sample],
                  ) -> tuple[list[list[str]], list[str], list[str]]:
    """The TLS rows, the verdict and informational lines (the target on CPU µs per request
    against HAProxy's; what TLS adds to the same proxy's plain HTTP/1.1 row of this run; the
    footnotes) and one line per failed row."""
    good, summary, rows, failures = _side_rows(samples, names, load_cpu, skipped, "tls")
    med = summary.med
    info = []
    if "lameduck" in med and "haproxy" in med:
        info.append("lameduck CPU per request vs HAProxy: "
                    + cpu_ratio_verdict(med["lameduck"], med["haproxy"], TARGET_TLS_RATIO))
    for n in good:
        cpu, h1 = _median(samples, "cpu_us_per_req", n), _median(h1_samples, "cpu_us_per_req", n)
        line = f"{n}: {cpu:.1f} µs CPU/request over TLS"
        if h1:
            line += (f", {h1:.1f} over plain HTTP/1.1 in this run's first table "
                     f"({cpu - h1:+.1f} µs, {cpu / h1:.2f}x)")
        info.append(line)
    info += _ratio_info(summary, "over TLS")
    return rows, [*info, *summary.notes], failures


def summarize_pool(samples: list[Sample], names: list[str], load_cpu: int,
                   skipped: dict[str, str], h1_samples: list[Sample],
                   ) -> tuple[list[list[str]], list[str], list[str]]:
    """The pool rows, informational lines (no target: CPU µs/request and req/s next to the
    same proxy's single-endpoint HTTP/1.1 row of this run; the footnotes) and one line per
    failed row."""
    good, summary, rows, failures = _side_rows(samples, names, load_cpu, skipped, "pool")
    info = []
    for n in good:
        cpu, h1 = _median(samples, "cpu_us_per_req", n), _median(h1_samples, "cpu_us_per_req", n)
        line = f"{n}: {cpu:.1f} µs CPU/request through the pool of {POOL_SIZE}"
        if h1:
            ratio = rps_ratio(summary.med[n],
                              _medians([s for s in h1_samples if s.proxy == n], load_cpu))
            line += (f", {h1:.1f} with the single endpoint in this run's first table "
                     f"({cpu - h1:+.1f} µs, {cpu / h1:.2f}x); req/s "
                     + ("n/s (one of the two rows not saturated)" if ratio is None
                        else f"{ratio:.2f}x that row's"))
        info.append(line)
    info += _ratio_info(summary, "through the pool")
    return rows, [*info, *summary.notes], failures


H2_HEADERS = ["h2 shape", "proxy", "req/s (median)", "mean", "p50", "p99", "CPU µs/req",
              "proxy CPU", "load CPU", "vs HAProxy req/s", "errors", "limit"]


def h2_round_rows(samples: list[H2Sample], args: argparse.Namespace) -> list[list[str]]:
    out = []
    for s in samples:
        if s.failed and not s.cpu_pct:
            out.append([str(s.round), s.shape, s.proxy, "FAILED", "-", "-", "-", "-", "-", "-",
                        "-", str(s.errors)])
            continue
        out.append([str(s.round), s.shape, s.proxy,
                    f"{s.rps:,.0f}" + (" (FAILED)" if s.failed else ""), f"{s.mean_ms:.2f}",
                    f"{s.p50_ms:.2f}", f"{s.p99_ms:.2f}", f"{s.cpu_us_per_req:.1f}",
                    f"{s.proxy_cpu_pct:.0f}%", f"{s.cpu_pct[args.proxy_cpu]:.0f}%",
                    f"{s.cpu_pct[args.load_cpu]:.0f}%", str(s.errors)])
    return out


def h2_round_headers(args: argparse.Namespace) -> list[str]:
    return ["round", "h2 shape", "proxy", "req/s", "mean ms", "p50 ms", "p99 ms", "CPU µs/req",
            "proxy CPU", f"cpu{args.proxy_cpu} busy", f"cpu{args.load_cpu} busy", "errors"]


HEADERS = ["proxy", "req/s (median)", "p50", "p99", "CPU µs/req", "proxy CPU", "load CPU",
           "vs HAProxy req/s", "errors", "limit"]


NO_TARGET_LINE = "no target for this path (informational):"


def print_part(title: str, rows: list[list[str]], target: str, info: list[str],
               failures: list[str], part_notes: list[str]) -> None:
    """One part's text summary, as every part after the first prints it: title, table, its
    target line (or that it has none), what it says, what failed, its notes."""
    print()
    print(title)
    print(text_table(rows))
    print()
    print(target)
    for x in info:
        print("  " + x)
    for f in failures:
        print("  failed: " + f)
    for n in part_notes:
        print("note: " + n)


def text_table(rows: list[list[str]], headers: list[str] = HEADERS, left: int = 1) -> str:
    """Aligned columns; the first ``left`` ones flush left, the numbers flush right."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(str(c).ljust(w) if i < left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def md_table(rows: list[list[str]], headers: list[str] = HEADERS) -> str:
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def round_rows(samples: list[Sample], args: argparse.Namespace) -> list[list[str]]:
    return [[str(s.round), s.proxy, f"{s.rps:,.0f}", f"{s.p50_ms:.2f}", f"{s.p99_ms:.2f}",
             f"{s.cpu_us_per_req:.1f}", f"{s.proxy_cpu_pct:.0f}%",
             f"{s.cpu_pct[args.proxy_cpu]:.0f}%", f"{s.cpu_pct[args.load_cpu]:.0f}%",
             str(s.errors)] for s in samples]


def round_headers(args: argparse.Namespace) -> list[str]:
    return ["round", "proxy", "req/s", "p50 ms", "p99 ms", "CPU µs/req", "proxy CPU",
            f"cpu{args.proxy_cpu} busy", f"cpu{args.load_cpu} busy", "errors"]


def origin_desc(args: argparse.Namespace) -> str:
    """What --origin put behind the proxies, in words for the results."""
    if args.origin == "nginx":
        return ("an nginx origin (one process, `return 200` with a fixed 36-byte body; "
                "Connection: keep-alive, Date and Server in every response)")
    return "the Python demo origin (`python -m lameduck.demo`; no Connection header)"


def limit_text(args: argparse.Namespace) -> str:
    """How to read the proxy CPU, load CPU, limit and ratio columns (every wrk/h2load table)."""
    return (
        "*proxy CPU* is the proxy's utime+stime over the round's wall time (100% = its "
        f"core); *load CPU* how busy CPU {args.load_cpu} (origin + client) was. *limit*: "
        f"`proxy` when the proxy ran at >= {PROXY_SATURATED:g}% of its core, "
        f"`cpu{args.load_cpu} (load)` when the load core was >= {SATURATED:g}% busy, both, or "
        f"`neither`. A ratio to HAProxy is printed only when both rows' proxies were at >= "
        f"{PROXY_SATURATED:g}% (saturated); otherwise it reads `n/s` (not saturated): a proxy "
        "that was not the limit ran at the pace the rest of the setup allowed, and its req/s "
        "says nothing of what it can do. CPU µs/req compares either way.")


def h2_markdown(h2, args) -> list[str]:
    """The HTTP/2 section: ``h2`` is (rows, verdict, failures, notes, samples) from the h2
    rounds."""
    rows, verdict, failures, notes, samples = h2
    warm = (f" with a {args.h2_warmup:g} s h2load warm-up each" if args.h2_warmup > 0 else "")
    return [
        "## HTTP/2 (h2c prior knowledge)",
        "",
        f"h2load -t1 against {', '.join(args.h2_names)}: {args.rounds} interleaved rounds x "
        f"{args.h2_duration:g} s per proxy and shape{warm}, after the HTTP/1.1 rounds; shapes "
        + ", ".join(f"`{label}` = `-c{c} -m{m}`" for label, c, m in H2_SHAPES)
        + f". The origin is the first table's, {origin_desc(args)} (both proxies speak "
        "HTTP/1.1 upstream); `h2-h2` rows go to the h2c origin instead.",
        "",
        md_table(rows, H2_HEADERS),
        "",
        *[f"{x}.\n" for x in notes],
        TARGET_H2_LINE + ":",
        "",
        *[f"- {x}" for x in verdict],
        "",
        *[f"Failed: {f}\n" for f in failures],
        "Medians over the rounds that worked; *mean* is h2load's mean time per request, p50 "
        "and p99 come from its `--log-file`. CPU µs/req counts the proxy's CPU time from "
        "h2load's \"main duration started\" to \"over\" (its warm-up excluded) divided by the "
        "requests that succeeded in that period; proxy and load CPU cover that period too. A "
        "row is FAILED when any of its rounds had a failed, errored or timed-out request, a "
        "non-2xx status, or no h2load summary. " + limit_text(args),
        "",
        "### HTTP/2 rounds",
        "",
        md_table(h2_round_rows(samples, args), h2_round_headers(args)),
        "",
    ]


def _side_markdown(title: str, intro: str, part, tail: str, rounds_title: str,
                   args, info_title: str = "No target is set for this path; for information:",
                   ) -> list[str]:
    """A part measured like the HTTP/1.1 one: ``part`` is (rows, info, failures, samples,
    notes)."""
    rows, info, failures, samples, notes = part
    return [
        f"## {title}",
        "",
        intro,
        "",
        md_table(rows),
        "",
        info_title,
        "",
        *[f"- {x}" for x in info],
        "",
        *[f"Failed: {f}\n" for f in failures],
        *[f"Note: {n}.\n" for n in notes],
        "Same columns and method as the HTTP/1.1 table (CPU µs/req = the proxy's utime+stime "
        f"over the round / requests wrk completed){tail} " + limit_text(args),
        "",
        f"### {rounds_title}",
        "",
        md_table(round_rows(samples, args), round_headers(args)),
        "",
    ]


def h2up_markdown(h2up, args) -> list[str]:
    """The HTTP/2-upstream section: ``h2up`` is (rows, info, failures, samples, notes)."""
    warm = (f" after a {args.h2up_warmup:g} s warm-up each" if args.h2up_warmup > 0 else "")
    intro = (
        f"wrk -t{args.threads} -c{args.connections} keep-alive GET / against "
        f"{', '.join(args.h2up_names)}, {args.rounds} interleaved rounds x "
        f"{args.h2up_duration:g} s per proxy{warm}, after the other parts. The origin is nginx "
        "(one worker process, on the load CPU) answering a fixed 25-byte body over h2c prior "
        "knowledge only; lameduck reaches it through a cluster with `protocol: h2` "
        f"(`http2.max_concurrent_streams: {H2UP_STREAMS}`), HAProxy through "
        "`server ... proto h2` with `http-reuse always`. Both add X-Forwarded-For.")
    return _side_markdown(
        "HTTP/1.1 clients → HTTP/2 (h2c) upstream", intro, h2up,
        f". The HTTP/1.1-upstream comparison above uses {origin_desc(args)}; both answer a "
        "few headers and a short body.",
        "HTTP/2-upstream rounds", args)


def tls_markdown(tls, args) -> list[str]:
    """The TLS section: ``tls`` is (rows, info, failures, samples, notes)."""
    warm = (f" after a {args.tls_warmup:g} s warm-up each" if args.tls_warmup > 0 else "")
    intro = (
        f"wrk -t{args.threads} -c{args.connections} keep-alive GET / over https against "
        f"{', '.join(args.tls_names)}, {args.rounds} interleaved rounds x "
        f"{args.tls_duration:g} s per proxy{warm}, after the other parts: one TLS handshake "
        "per connection, then requests on it. Each proxy terminates TLS on another listener "
        "(lameduck `tls: {certificate, key, alpn: [http/1.1]}`, HAProxy `bind ... ssl crt` "
        f"with `ciphersuites {TLS_CIPHERSUITE}`; a self-signed P-256 certificate) and forwards "
        f"over plain HTTP/1.1 keep-alive to {origin_desc(args)}. {TARGET_TLS_LINE}.")
    return _side_markdown("HTTPS (TLS keep-alive) clients → HTTP/1.1 upstream", intro, tls,
                          "", "TLS rounds", args, "The target and, for information:")


def pool_markdown(pool, args) -> list[str]:
    """The pool section: ``pool`` is (rows, info, failures, samples, notes)."""
    warm = (f" after a {args.pool_warmup:g} s warm-up each" if args.pool_warmup > 0 else "")
    hc = POOL_HEALTH_CHECK
    intro = (
        f"wrk -t{args.threads} -c{args.connections} keep-alive GET / against "
        f"{', '.join(args.pool_names)}, {args.rounds} interleaved rounds x "
        f"{args.pool_duration:g} s per proxy{warm}, after the other parts. The origins are "
        f"{POOL_SIZE} of the first table's origin ({origin_desc(args)}), each one process on "
        "the load CPU, each answering `GET /health` with 200. lameduck reaches them through "
        "a cluster with `lb_policy: round_robin`, "
        f"`health_check: {{path: {hc['path']}, interval: {hc['interval']}, timeout: "
        f"{hc['timeout']}, rise: {hc['rise']}, fall: {hc['fall']}}}`, `outlier_detection: {{}}` "
        "and the default retry_policy; HAProxy through `balance roundrobin`, "
        "`option httpchk GET /health` and `server ... check inter 1s rise 2 fall 3`, with "
        "`http-reuse always`. Both add X-Forwarded-For.")
    return _side_markdown(
        f"HTTP/1.1 through a pool of {POOL_SIZE} origins (round robin, health checks)", intro,
        pool, "; the single-endpoint comparison uses the same origin program.",
        "Pool rounds", args)


def write_markdown(path: Path, summary: Summary, samples, args, command: str,
                   notes: list[str], h2=None, h2up=None, pool=None, workers=None,
                   shapes=None, tls=None, h3=None) -> None:
    v = _versions(args)
    lines = [
        "# lameduck benchmark results",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M:%S %Z')} with `{command}`"
        + (": only the workers rows." if not args.names else
           f": {args.rounds} interleaved rounds x {args.duration:g} s per proxy, wrk "
           f"-t{args.threads} -c{args.connections} keep-alive GET / (after a "
           f"{args.warmup:g} s warm-up each); proxies pinned to CPU {args.proxy_cpu}, the "
           f"origin and wrk to CPU {args.load_cpu}. The origin is {origin_desc(args)}; it "
           f"answered `GET /` with {args.origin_info}."),
        "",
    ]
    if args.names:
        lines += [
            md_table(summary.rows),
            "",
            *[f"{x}.\n" for x in summary.notes],
            TARGET_LINE + ":",
            "",
            *[f"- {x}" for x in summary.verdict],
            "",
            "Medians over the rounds. *CPU µs/req* is the proxy's utime+stime over the round "
            "divided by the requests wrk completed. " + limit_text(args),
            "",
        ]
    lines += [
        *[f"Note: {n}.\n" for n in notes],
        *(["## Rounds", "", md_table(round_rows(samples, args), round_headers(args)), ""]
          if args.names else []),
        *(shapes_markdown(*shapes, args) if shapes else []),
        *(h2_markdown(h2, args) if h2 else []),
        *(h2up_markdown(h2up, args) if h2up else []),
        *(pool_markdown(pool, args) if pool else []),
        *(tls_markdown(tls, args) if tls else []),
        *(h3_markdown(*h3, args) if h3 else []),
        *(workers_markdown(workers, args) if workers else []),
        "## Environment",
        "",
        *[f"- {k}: {val}" for k, val in v.items()],
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


# --------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--duration", type=float, default=5, help="seconds per proxy per round (5)")
    p.add_argument("--warmup", type=float, default=2, help="warm-up seconds per proxy (2)")
    p.add_argument("--connections", type=int, default=50, help="wrk connections (50)")
    p.add_argument("--threads", type=int, default=1, help="wrk threads (1)")
    p.add_argument("--proxies", default=",".join(PROXIES),
                   help="comma-separated subset of lameduck,haproxy,nginx")
    p.add_argument("--origin", choices=ORIGINS, default="nginx",
                   help="what answers behind the proxies in the HTTP/1.1, h2 and pool rows: "
                   "nginx (one process, return 200, keep-alive; default) or demo (the Python "
                   "demo origin, the old behaviour: no Connection header, and it saturates "
                   "the load CPU before HAProxy and nginx saturate theirs)")
    p.add_argument("--lameduck-base", metavar="PATH", default=None,
                   help="another lameduck executable (e.g. a checkout's .venv/bin/lameduck): "
                   f"measured as {BASE} beside lameduck, with the same generated config, in the "
                   "same interleaved HTTP/1.1, h2 and h2-upstream rounds")
    p.add_argument("--proxy-cpu", type=int, default=0, help="CPU for the proxies (0)")
    p.add_argument("--proxy-quota", type=int, default=None, metavar="PCT",
                   help="cap every proxy (each in a cgroup of its own, CFS quota) at PCT %% of "
                   "its core, so that a proxy faster than one load core can feed is still the "
                   "limit: 'saturated' then means >= 85%% of PCT. Needs root (cgroup v1 or v2)")
    p.add_argument("--load-cpu", type=int, default=1, help="CPU for origin and wrk (1)")
    p.add_argument("--out", type=Path, default=OUT_DIR / "results.md",
                   help="markdown results file (bench/out/results.md)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (configs, logs)")
    p.add_argument("--h2", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the HTTP/2 rows: h2load over h2c against lameduck and "
                   "haproxy (those of --proxies), shapes -c5 -m10 and -c50 -m1 (default on)")
    p.add_argument("--h2-duration", type=float, default=None,
                   help="measured seconds per proxy, shape and round for h2load "
                   "(default: --duration, at most 3)")
    p.add_argument("--h2-warmup", type=float, default=None,
                   help="h2load --warm-up-time before each of those (default: --warmup, "
                   "at most 1; 0 = none)")
    p.add_argument("--h2-upstream", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the HTTP/2-upstream rows: wrk (HTTP/1.1) against lameduck "
                   "and haproxy (those of --proxies), each forwarding to an nginx origin over "
                   "h2c prior knowledge (default on)")
    p.add_argument("--h2-upstream-duration", type=float, default=None,
                   help="seconds per proxy and round for those rows (default: --duration, "
                   "at most 4)")
    p.add_argument("--h2-upstream-warmup", type=float, default=None,
                   help="wrk warm-up seconds per proxy before those rounds (default: "
                   "--warmup, at most 1; 0 = none)")
    p.add_argument("--pool", action=argparse.BooleanOptionalAction, default=True,
                   help=f"also run the pool rows: wrk against lameduck and haproxy (those of "
                   f"--proxies), each spreading requests round robin over {POOL_SIZE} origins "
                   "(as --origin) with active health checks (default on)")
    p.add_argument("--pool-duration", type=float, default=None,
                   help="seconds per proxy and round for those rows (default: --duration, "
                   "at most 4)")
    p.add_argument("--pool-warmup", type=float, default=None,
                   help="wrk warm-up seconds per proxy before those rounds (default: "
                   "--warmup, at most 1; 0 = none)")
    p.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the TLS rows: wrk over https keep-alive against lameduck and "
                   "haproxy (those of --proxies), each with a TLS listener (self-signed P-256 "
                   f"certificate made by openssl, {TLS_CIPHERSUITE}) forwarding to the origin "
                   "over plain HTTP/1.1 (default on)")
    p.add_argument("--tls-duration", type=float, default=None,
                   help="seconds per proxy and round for those rows (default: --duration, "
                   "at most 5)")
    p.add_argument("--tls-warmup", type=float, default=None,
                   help="wrk warm-up seconds per proxy before those rounds (default: "
                   "--warmup, at most 1; 0 = none)")
    p.add_argument("--h3", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the HTTP/3 rows: a lameduck of its own with a TLS listener "
                   "serving HTTP/3 (http3: {}), loaded by bench/h3load.py over QUIC and, in "
                   "the same rounds, by h2load over TLS (ALPN h2), both -c5 -m10, under one "
                   "CPU quota (--h3-quota); no ratio: no HTTP/3 anchor runs here (default on)")
    p.add_argument("--h3-duration", type=float, default=None,
                   help="measured seconds per protocol and round (default: --duration, at "
                   "most 5)")
    p.add_argument("--h3-warmup", type=float, default=None,
                   help="the clients' --warm-up-time before each of those (default: "
                   "--warmup, at most 1; 0 = none)")
    p.add_argument("--h3-quota", type=int, default=H3_QUOTA, metavar="PCT",
                   help="cap the HTTP/3 part's lameduck (a cgroup of its own, CFS quota) at "
                   "PCT %% of its core, for both protocols, so that it is the limit (at >= "
                   "85%% of PCT) while the load core keeps room: over HTTP/2 h2load and the "
                   "origin cost about what lameduck does per request (default "
                   f"{H3_QUOTA}; 100 = no cap; below 100 needs root)")
    p.add_argument("--shapes", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the response-shape matrix in the HTTP/1.1 rounds: wrk "
                   "against lameduck and haproxy (those of --proxies) for each shape (plain, "
                   "keep-alive, chunked, 16k, 30 fields: one nginx origin and one HAProxy "
                   "origin) and against the floor relay (bench/floor_relay.py) for keep-alive "
                   "(default on)")
    p.add_argument("--shapes-duration", type=float, default=None,
                   help="seconds per proxy, shape and round (default: --duration, at most 3)")
    p.add_argument("--shapes-warmup", type=float, default=None,
                   help="wrk warm-up seconds per proxy and shape before the rounds (default: "
                   "--warmup, at most 1; 0 = none)")
    p.add_argument("--workers", default=None, metavar="N[,N...]",
                   help="also measure lameduck with `workers: N` (a main process and N worker "
                   "processes) against `workers: 1`: CPU per request with both pinned to "
                   "--proxy-cpu (what the split costs), then req/s with lameduck, an nginx "
                   "origin and wrk spread over every allowed CPU (scaling), and the share of "
                   "requests each worker served. A list (1,2,4,8) gives the scaling curve; "
                   "auto = one per allowed CPU")
    p.add_argument("--workers-only", action="store_true",
                   help="only the --workers rows: no HAProxy, nginx or other part (--proxies "
                   "is not read)")
    p.add_argument("--workers-duration", type=float, default=None,
                   help="seconds per workers count and round (default: --duration)")
    p.add_argument("--workers-warmup", type=float, default=None,
                   help="wrk warm-up seconds per workers count and part (default: --warmup)")
    p.add_argument("--workers-threads", type=int, default=None,
                   help="wrk threads of the spread-out rows (default: --threads, or a "
                   "quarter of the allowed CPUs if more)")
    args = p.parse_args(argv)
    args.worker_counts = []
    if args.workers is not None:
        counts = {1}
        for item in args.workers.split(","):
            item = item.strip()
            if item == "auto":
                counts.add(len(os.sched_getaffinity(0)))
            elif item.isdigit() and 1 <= int(item) <= 256:
                counts.add(int(item))
            else:
                p.error(f"--workers: {item!r} is not a count from 1 to 256 or auto")
        if counts == {1}:
            p.error("--workers: give a count above 1 (workers: 1 is measured beside it)")
        args.worker_counts = sorted(counts)
    elif args.workers_only:
        p.error("--workers-only needs --workers")
    args.workers_duration = (args.duration if args.workers_duration is None
                             else args.workers_duration)
    args.workers_warmup = args.warmup if args.workers_warmup is None else args.workers_warmup
    if args.workers_duration <= 0 or args.workers_warmup < 0 or (
            args.workers_threads is not None and args.workers_threads < 1):
        p.error("--workers-duration and --workers-threads must be positive and "
                "--workers-warmup not negative")
    if args.workers_only:  # the other parts and proxies off: --proxies is not read
        args.h2, args.h2_upstream, args.pool, args.shapes = False, False, False, False
        args.tls, args.h3 = False, False
        names = []
    else:
        names = [n.strip() for n in args.proxies.split(",") if n.strip()]
        bad = [n for n in names if n not in PROXIES]
        if bad or not names:
            p.error(f"--proxies: unknown {bad}; choose from {', '.join(PROXIES)}")
    if args.lameduck_base is not None:
        base = Path(args.lameduck_base).expanduser()
        if not (base.is_file() and os.access(base, os.X_OK)):
            p.error(f"--lameduck-base {args.lameduck_base}: not an executable file")
        if args.workers_only:
            p.error("--lameduck-base is measured in the HTTP/1.1 and h2 rounds, not with "
                    "--workers-only")
        # absolute, not resolved: a venv's bin/lameduck finds its packages through its path
        args.lameduck_base = str(base.absolute())
        at = names.index("lameduck") + 1 if "lameduck" in names else 0
        names.insert(at, BASE)  # beside lameduck, so the rows and rounds sit together
    args.names = names
    args.origin_info = "?"  # what the origin answered GET / with (headers), set at start
    args.builds = {}  # lameduck (and lameduck-base) version, commit, compiled or not
    if args.rounds < 1 or args.duration <= 0 or args.connections < 1 or args.threads < 1:
        p.error("--rounds, --duration, --connections and --threads must be positive")
    if args.proxy_quota is not None and not 10 <= args.proxy_quota <= 100:
        p.error("--proxy-quota: a percentage of one core from 10 to 100")
    if not 10 <= args.h3_quota <= 100:
        p.error("--h3-quota: a percentage of one core from 10 to 100")
    # Each later part's measured and warm-up seconds: its own flag, else --duration capped at
    # the part's default (and --warmup at 1 s); its proxies among --proxies, when it runs.
    for part, flag, cap, on, proxies, duration, warmup in (
            ("h2", "--h2", 3.0, args.h2, H2_PROXIES, args.h2_duration, args.h2_warmup),
            ("h2up", "--h2-upstream", 4.0, args.h2_upstream, H2UP_PROXIES,
             args.h2_upstream_duration, args.h2_upstream_warmup),
            ("pool", "--pool", 4.0, args.pool, POOL_PROXIES, args.pool_duration,
             args.pool_warmup),
            ("shapes", "--shapes", 3.0, args.shapes, SHAPES_PROXIES, args.shapes_duration,
             args.shapes_warmup),
            ("tls", "--tls", 5.0, args.tls, TLS_PROXIES, args.tls_duration, args.tls_warmup),
            ("h3", "--h3", 5.0, args.h3, H3_PROXIES, args.h3_duration, args.h3_warmup)):
        duration = min(args.duration, cap) if duration is None else duration
        warmup = max(0.0, min(args.warmup, 1.0)) if warmup is None else warmup
        if duration <= 0 or warmup < 0:
            p.error(f"{flag}-duration must be positive and {flag}-warmup not negative")
        setattr(args, f"{part}_duration", duration)
        setattr(args, f"{part}_warmup", warmup)
        setattr(args, f"{part}_names", [n for n in names if n in proxies] if on else [])
    cpus = os.sched_getaffinity(0)
    for flag, cpu in (("--proxy-cpu", args.proxy_cpu), ("--load-cpu", args.load_cpu)):
        if cpu not in cpus:
            p.error(f"{flag} {cpu}: not an allowed CPU here (allowed: {sorted(cpus)})")
    if args.proxy_cpu == args.load_cpu:
        print("bench: warning: proxy and load share one CPU; numbers will not be comparable "
              "to the 2-core target", file=sys.stderr)
    return args


def background_load(cpus: tuple[int, ...], seconds: float = 1.0) -> dict[int, float]:
    """How busy each CPU is before the bench starts anything (other jobs skew the numbers)."""
    a = cpu_busy()
    time.sleep(seconds)
    b = cpu_busy()
    return busy_pct(a, b, cpus)


def run_h2_rounds(procs: Procs, proxies: dict[str, tuple[Proc, int]], args: argparse.Namespace,
                  workdir: Path, samples: list[H2Sample], skipped: dict[str, str]) -> bool:
    """The HTTP/2 rounds, after the HTTP/1.1 ones (so a proxy whose HTTP/2 breaks cannot spoil
    those): a pre-check per proxy, then ``--rounds`` rounds, each shape in turn, the proxy
    order rotating as for wrk. A proxy that fails gets FAILED rows, never an exception.
    False when anything failed (the caller then keeps the logs)."""
    names = list(args.h2_names)
    ok = True
    for name in names:
        proc = proxies[name][0]
        # h2load checks the status only: curl checks that the origin's body comes back
        problem = (h2_precheck(procs, args.load_cpu, proc.h2_port)
                   or h2c_check(procs, args.load_cpu, proc.h2_port, HELLO))
        if problem:
            skipped[name] = problem
            ok = False
            print(f"bench: warning: {name} h2: {problem}; skipping its HTTP/2 rounds\n"
                  f"{name} log tail ({proc.log}):\n{proc.tail(15)}", file=sys.stderr)
    active = [n for n in names if n not in skipped]
    for rnd in range(1, args.rounds + 1):
        if not active:
            break
        k = (rnd - 1) % len(active)
        order = active[k:] + active[:k]
        for shape in (*H2_SHAPES, H2H2_SHAPE):
            for name in order:
                if name in skipped:
                    continue
                proc = proxies[name][0]
                if shape is H2H2_SHAPE and not proc.h2h2_port:
                    continue  # no h2c origin in this run
                s = measure_h2(procs, name, proc, shape, args, rnd, workdir)
                samples.append(s)
                if s.failed:
                    ok = False
                    print(f"round {rnd} h2 {shape[0]:4} {name:13} FAILED: {s.failed}", flush=True)
                    if not proc.alive():
                        skipped[name] = s.failed
                        print(f"bench: {name} exited; log tail ({proc.log}):\n{proc.tail()}",
                              file=sys.stderr)
                    continue
                print(f"round {rnd} h2 {shape[0]:4} {name:13} {s.rps:>10,.0f} req/s  "
                      f"mean {s.mean_ms:6.2f} ms  p99 {s.p99_ms:6.2f} ms  "
                      f"{s.cpu_us_per_req:6.1f} µs/req  proxy CPU {s.proxy_cpu_pct:3.0f}%  "
                      f"cpu{args.load_cpu} {s.cpu_pct[args.load_cpu]:3.0f}%  errors {s.errors}",
                      flush=True)
    return ok


def run_h2up_rounds(procs: Procs, proxies: dict[str, tuple[Proc, int]], origin: Proc,
                    args: argparse.Namespace, samples: list[Sample],
                    skipped: dict[str, str]) -> bool:
    """HTTP/1.1 clients -> proxy -> h2c origin, after the other parts: a keep-alive pre-check
    per proxy on its h2-upstream listener, a wrk warm-up, then ``--rounds`` rounds of
    ``--h2-upstream-duration`` with the order rotating. A proxy that fails the pre-check, dies
    or whose wrk fails gets a FAILED row, never an exception. False when anything failed or
    any round had errors (the caller then keeps the logs)."""
    return _run_wrk_part(
        procs, proxies, [("the nginx h2c origin", origin)], args, samples, skipped,
        names=args.h2up_names, port_of=lambda proc: proc.h2up_port, expect=H2_HELLO,
        precheck_requests=3, label="h2-upstream", tag="h2up", duration=args.h2up_duration,
        warmup=args.h2up_warmup)


def run_pool_rounds(procs: Procs, proxies: dict[str, tuple[Proc, int]], origins: list[Proc],
                    args: argparse.Namespace, samples: list[Sample],
                    skipped: dict[str, str]) -> bool:
    """HTTP/1.1 clients -> proxy -> pool of origins, last: as ``run_h2up_rounds``, on the
    pool listener, with ``--pool-duration`` and ``--pool-warmup``; the pre-check sends two
    requests per origin on one connection."""
    return _run_wrk_part(
        procs, proxies, [(f"pool origin {o.name}", o) for o in origins], args, samples,
        skipped, names=args.pool_names, port_of=lambda proc: proc.pool_port, expect=HELLO,
        precheck_requests=2 * POOL_SIZE, label="pool", tag="pool",
        duration=args.pool_duration, warmup=args.pool_warmup)


def run_tls_rounds(procs: Procs, proxies: dict[str, tuple[Proc, int]], origin: Proc,
                   args: argparse.Namespace, samples: list[Sample],
                   skipped: dict[str, str]) -> bool:
    """HTTPS clients -> proxy -> the main origin over plain HTTP/1.1: as ``run_h2up_rounds``,
    on the TLS listener, wrk over https, with ``--tls-duration`` and ``--tls-warmup``."""
    return _run_wrk_part(
        procs, proxies, [("the origin", origin)], args, samples, skipped,
        names=args.tls_names, port_of=lambda proc: proc.tls_port, expect=HELLO,
        precheck_requests=3, label="tls", tag="tls", duration=args.tls_duration,
        warmup=args.tls_warmup, scheme="https")


def _run_wrk_part(procs: Procs, proxies: dict[str, tuple[Proc, int]],
                  origins: list[tuple[str, Proc]], args: argparse.Namespace,
                  samples: list[Sample], skipped: dict[str, str], *, names: list[str],
                  port_of: Callable[[Proc], int], expect: bytes, precheck_requests: int,
                  label: str, tag: str, duration: float, warmup: float,
                  scheme: str = "http") -> bool:
    """A wrk part after the HTTP/1.1 rows, on another listener of the same proxies: a
    keep-alive pre-check per proxy, a wrk warm-up, then ``--rounds`` rounds of ``duration``
    with the order rotating. A proxy that fails the pre-check, dies or whose wrk fails gets a
    FAILED row, never an exception; so do all when one of ``origins`` (description, process)
    exits. False when anything failed or any round had errors (the caller keeps the logs)."""
    ok = True

    def fail(name: str, why: str) -> None:
        nonlocal ok
        ok = False
        skipped.setdefault(name, why)
        proc = proxies[name][0]
        print(f"bench: warning: {name} {label}: {why}\n{name} log tail ({proc.log}):\n"
              f"{proc.tail(15)}", file=sys.stderr)

    for name in names:
        if name not in skipped:
            problem = keepalive_check(port_of(proxies[name][0]), requests=precheck_requests,
                                      expect=expect, tls=scheme == "https")
            if problem:
                fail(name, f"pre-check: {problem}; no rounds")
    active = [n for n in names if n not in skipped]
    if warmup > 0:
        for name in active:
            print(f"warm-up {name} {label} {warmup:g}s", flush=True)
            try:
                run_wrk(procs, args.load_cpu, port_of(proxies[name][0]), warmup,
                        args.connections, args.threads, scheme=scheme)
            except BenchError as e:
                fail(name, f"warm-up: {e}")
    for rnd in range(1, args.rounds + 1):
        k = (rnd - 1) % max(1, len(active))
        for name in active[k:] + active[:k]:
            if name in skipped:
                continue
            proc = proxies[name][0]
            try:
                s = measure(procs, name, proc, port_of(proc), args, rnd, duration,
                            scheme=scheme)
            except BenchError as e:
                fail(name, f"round {rnd}: {e}")
                continue
            samples.append(s)
            ok = ok and s.errors == 0
            print(f"round {rnd} {tag} {name:13} {s.rps:>10,.0f} req/s  p50 {s.p50_ms:6.2f} ms  "
                  f"p99 {s.p99_ms:6.2f} ms  {s.cpu_us_per_req:6.1f} µs/req  "
                  f"proxy CPU {s.proxy_cpu_pct:3.0f}%  cpu{args.load_cpu} "
                  f"{s.cpu_pct[args.load_cpu]:3.0f}%  errors {s.errors}", flush=True)
            for what, origin in origins:
                if not origin.alive():
                    why = (f"{what} exited (code {origin.popen.returncode}) in round {rnd}; "
                           f"its log tail ({origin.log}):\n{origin.tail(15)}")
                    for n in active:
                        fail(n, why)
                    return False
    return ok


def pool_checks(proxies: dict[str, tuple[Proc, int]], args: argparse.Namespace,
                samples: list[Sample], skipped: dict[str, str]) -> tuple[list[str], bool]:
    """After the pool rounds: how many requests each origin served through each proxy (lameduck:
    rq_total per host of GET /clusters?format=json; HAProxy: hrsp_2xx per server of its stats
    socket; warm-ups and pre-checks included), lameduck's pool counters, and whether every
    origin served requests and no round had errors. (note lines, all checks passed)"""
    notes, ok = [], True
    for name in args.pool_names:
        proc = proxies[name][0]
        if not proc.alive():
            continue
        try:
            if name == "lameduck":
                hosts = lameduck_pool_hosts(proc)
                counts = [h["rq_total"] for h in hosts]
                notes.append(
                    "lameduck requests per pool origin (GET /clusters?format=json, rq_total; "
                    "warm-up and pre-check included): " + ", ".join(
                        f"{h['address']}={h['rq_total']:,} (rq_error {h['rq_error']}, "
                        f"{h['health']})" for h in hosts))
            else:
                servers = haproxy_pool_servers(proc)
                counts = [sv["hrsp_2xx"] for sv in servers]
                notes.append(
                    "haproxy responses per pool server (show stat, hrsp_2xx; warm-up and "
                    "pre-check included): " + ", ".join(
                        f"{sv['name']} {sv['address']}={sv['hrsp_2xx']:,} ({sv['status']}, "
                        f"chkfail {sv['chkfail']})" for sv in servers))
        except (OSError, ValueError, KeyError, BenchError) as e:
            notes.append(f"{name}: could not read its per-origin counts: {e}")
            ok = False
            continue
        if len(counts) != POOL_SIZE or min(counts) <= 0:
            notes.append(f"CHECK FAILED: not every pool origin served requests through {name}")
            ok = False
    with contextlib.suppress(OSError, ValueError, KeyError):
        if "lameduck" in proxies and proxies["lameduck"][0].alive():
            c = lameduck_counters(proxies["lameduck"][0], pool=True)
            notes.append("lameduck counters of its pool listener and cluster after the run "
                         "(warm-up included): " + ", ".join(f"{k}={v}" for k, v in c.items()))
    errors = {n: sum(s.errors for s in samples if s.proxy == n) for n in args.pool_names}
    if any(errors.values()) or skipped:
        notes.append("CHECK FAILED: errors in the pool rounds: " + ", ".join(
            f"{n} {e}" for n, e in errors.items()) + (
            f"; failed: {', '.join(skipped)}" if skipped else ""))
        ok = False
    else:
        notes.append("checked: every pool origin served requests through "
                     f"{' and '.join(args.pool_names)}, 0 errors")
    return notes, ok


# --------------------------------------------------------------------------------------------
# The response-shape matrix (--shapes): lameduck and HAProxy (and the floor relay, against the
# keep-alive shape) measured by wrk inside the HTTP/1.1 rounds, one row per shape.
# --------------------------------------------------------------------------------------------

@dataclass
class ShapesPart:
    """The shape matrix through the run: the origins (by Shape.origin), what each origin sent
    for each shape (raw), the floor relay, the units measured (proxy, shape, process, port),
    their samples, and the units that failed ((proxy, shape label): why)."""
    origins: dict[str, tuple[Proc, int]] = field(default_factory=dict)
    wire: dict[str, str] = field(default_factory=dict)
    floor: tuple[Proc, int] | None = None
    units: list[tuple[str, Shape, Proc, int]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    skipped: dict[tuple[str, str], str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def names(self, shape: Shape, args: argparse.Namespace) -> list[str]:
        """Who is measured on ``shape``: the proxies, and the floor relay on keep-alive."""
        return [*args.shapes_names, *([FLOOR] if shape is FLOOR_SHAPE else [])]

    def fail(self, name: str, shape: Shape, why: str) -> None:
        self.skipped.setdefault((name, shape.label), why)


def start_shapes(procs: Procs, args: argparse.Namespace, workdir: Path) -> ShapesPart:
    """The matrix's two origins on the load CPU, each shape checked on the wire, and the
    floor relay on the proxy CPU. What fails marks its rows FAILED; the rest still runs."""
    part = ShapesPart()
    starters = {"plain": lambda: start_plain_origin(procs, args.load_cpu, workdir),
                "nginx": lambda: start_shapes_origin(procs, args.load_cpu, workdir)}
    for kind, start in starters.items():
        shapes = [s for s in SHAPES if s.origin == kind]
        try:
            proc, port, *rest = start()
        except BenchError as e:
            for shape in shapes:
                for n in part.names(shape, args):
                    part.fail(n, shape, f"no {kind} origin: {e}")
            print(f"bench: warning: no {kind} shapes origin: {e}", file=sys.stderr)
            continue
        part.origins[kind] = (proc, port)
        has_sub_module = rest[0] if rest else True  # start_shapes_origin's third value
        for shape in shapes:
            try:
                if shape.chunked and not has_sub_module:
                    raise BenchError("this nginx has no sub module (nginx -V): no chunked "
                                     "shape")
                part.wire[shape.label] = shape_origin_check(port, shape)
            except BenchError as e:
                for n in part.names(shape, args):
                    part.fail(n, shape, f"origin: {e}")
                print(f"bench: warning: shape {shape.label}: {e}", file=sys.stderr)
    if "nginx" in part.origins:
        try:
            part.floor = start_floor(procs, args.proxy_cpu, part.origins["nginx"][1])
        except BenchError as e:
            part.fail(FLOOR, FLOOR_SHAPE, f"floor relay: {e}")
            print(f"bench: warning: no floor relay: {e}", file=sys.stderr)
            for proc in procs.procs:
                if proc.name == FLOOR:
                    procs.stop(proc)
                    break
    return part


def prepare_shapes(procs: Procs, proxies: dict[str, tuple[Proc, int]],
                   args: argparse.Namespace, part: ShapesPart) -> None:
    """Once the proxies run: a keep-alive pre-check per proxy and shape (3 GETs of its path on
    one connection must return its body), then a wrk warm-up of ``--shapes-warmup`` each."""
    for shape in SHAPES:
        for name in part.names(shape, args):
            if (name, shape.label) in part.skipped:
                continue
            if name == FLOOR:
                assert part.floor is not None
                proc, port = part.floor
            else:
                proc = proxies[name][0]
                port = proc.plain_port if shape.origin == "plain" else proc.shapes_port
            problem = keepalive_check(port, expect=shape.body, path=shape.path)
            if problem:
                part.fail(name, shape, f"pre-check: {problem}; no rounds")
                print(f"bench: warning: {name} shape {shape.label}: {problem}\n{name} log tail "
                      f"({proc.log}):\n{proc.tail(15)}", file=sys.stderr)
                continue
            part.units.append((name, shape, proc, port))
    if args.shapes_warmup > 0:
        for name, shape, _, port in part.units:
            print(f"warm-up {name} shape {shape.label} {args.shapes_warmup:g}s", flush=True)
            try:
                run_wrk(procs, args.load_cpu, port, args.shapes_warmup, args.connections,
                        args.threads, shape.path)
            except BenchError as e:
                part.fail(name, shape, f"warm-up: {e}")


def run_shapes_round(procs: Procs, args: argparse.Namespace, part: ShapesPart,
                     rnd: int) -> bool:
    """The matrix's units of round ``rnd`` (after the HTTP/1.1 rows of that round): shape by
    shape, the shapes' order and each shape's proxy order rotating with the round. A unit
    that fails gets a FAILED cell, never an exception; so do all of an origin's when it exits.
    False when anything failed or had errors."""
    ok = True
    k = (rnd - 1) % len(SHAPES)
    for shape in SHAPES[k:] + SHAPES[:k]:
        units = [u for u in part.units if u[1] is shape]
        j = (rnd - 1) % max(1, len(units))
        for name, _, proc, port in units[j:] + units[:j]:
            if (name, shape.label) in part.skipped:
                continue
            try:
                s = measure(procs, name, proc, port, args, rnd, args.shapes_duration, shape)
            except BenchError as e:
                part.fail(name, shape, f"round {rnd}: {e}")
                print(f"round {rnd} shape {shape.label:10} {name:9} FAILED: {e}", flush=True)
                ok = False
                continue
            part.samples.append(s)
            ok = ok and s.errors == 0
            print(f"round {rnd} shape {shape.label:10} {name:9} {s.rps:>10,.0f} req/s  "
                  f"p50 {s.p50_ms:6.2f} ms  p99 {s.p99_ms:6.2f} ms  "
                  f"{s.cpu_us_per_req:6.1f} µs/req  proxy CPU {s.proxy_cpu_pct:3.0f}%  "
                  f"cpu{args.load_cpu} {s.cpu_pct[args.load_cpu]:3.0f}%  errors {s.errors}",
                  flush=True)
            origin = part.origins[shape.origin][0]
            if not origin.alive():
                why = (f"the {shape.origin} shapes origin exited (code "
                       f"{origin.popen.returncode}) in round {rnd}; its log tail "
                       f"({origin.log}):\n{origin.tail(15)}")
                for n, sh, _, _ in part.units:
                    if sh.origin == shape.origin:
                        part.fail(n, sh, why)
                return False
    return ok


def _shape_cells(m: dict[str, float] | None, failed: bool) -> tuple[str, str, str]:
    """CPU µs/req, proxy CPU and req/s of one proxy's medians in a shape row."""
    if failed:
        return "FAILED", "-", "-"
    if m is None:
        return "-", "-", "-"
    return f"{m['cpu_us_per_req']:.1f}", f"{m['proxy_cpu_pct']:.0f}%", f"{m['rps']:,.0f}"


SHAPES_HEADERS = ["shape", "proxy", "µs/req", "HAProxy µs/req", "proxy CPU", "HAProxy CPU",
                  "req/s", "HAProxy req/s", "vs HAProxy req/s", "errors", "load CPU",
                  "limit (proxy / HAProxy)"]


def summarize_shapes(part: ShapesPart, args: argparse.Namespace,
                     ) -> tuple[list[list[str]], list[str], list[str], list[str]]:
    """One row per shape and proxy other than HAProxy (lameduck; the floor relay on
    keep-alive), beside HAProxy's figures for the same shape: medians of the rounds, the
    req/s ratio only where both were saturated. Also informational lines (each shape's CPU per
    request next to keep-alive's, the floor's next to lameduck's), the footnotes (saturation)
    and one line per failed cell."""
    rows, info, notes, failures = [], [], [], []
    med: dict[str, dict[str, dict[str, float]]] = {}
    for shape in SHAPES:
        med[shape.label] = {}
        for n in part.names(shape, args):
            ss = [s for s in part.samples if s.proxy == n and s.shape == shape.label]
            why = part.skipped.get((n, shape.label))
            if why:
                failures.append(f"{n} shape {shape.label}: {why}")
            elif ss:
                med[shape.label][n] = _medians(ss, args.load_cpu)
    for shape in SHAPES:
        m_shape = med[shape.label]
        ha = m_shape.get("haproxy")
        ha_failed = ("haproxy", shape.label) in part.skipped
        subjects = [n for n in part.names(shape, args) if n != "haproxy"] or ["-"]
        for n in subjects:
            m = m_shape.get(n)
            failed = n != "-" and (n, shape.label) in part.skipped
            us, cpu, rps = _shape_cells(m, failed)
            ha_us, ha_cpu, ha_rps = _shape_cells(ha, ha_failed)
            errors = "/".join(str(sum(s.errors for s in part.samples
                                      if s.proxy == p and s.shape == shape.label))
                              for p in (n, "haproxy") if p in part.names(shape, args))
            load = " / ".join(f"{x['load_pct']:.0f}%" for x in (m, ha) if x)
            limit = " / ".join(bound_by(x["proxy_cpu_pct"], x["load_pct"], args.load_cpu)
                               for x in (m, ha) if x)
            rows.append([shape.label, n, us, ha_us, cpu, ha_cpu, rps, ha_rps,
                         ratio_cell(m, ha) if m else "n/a", errors or "-", load or "-",
                         limit or "-"])
        notes += [f"{shape.label}: {x}" for x in saturation_notes(m_shape, ha is not None)]
    base = med[FLOOR_SHAPE.label]
    for shape in SHAPES:
        if shape is FLOOR_SHAPE:
            continue
        parts = []
        for n, m in med[shape.label].items():
            k = base.get(n)
            if k:
                d = m["cpu_us_per_req"] - k["cpu_us_per_req"]
                parts.append(f"{n} {m['cpu_us_per_req']:.1f} µs/req, {d:+.1f} µs "
                             f"({change(m['cpu_us_per_req'], k['cpu_us_per_req'])})")
        if parts:
            info.append(f"{shape.label} next to {FLOOR_SHAPE.label}: " + "; ".join(parts))
    floor, lame = base.get(FLOOR), base.get("lameduck")
    if floor:
        line = (f"floor relay (uvloop + httptools, no X-Forwarded-For) on "
                f"{FLOOR_SHAPE.label}: {floor['cpu_us_per_req']:.1f} µs/req")
        if lame and floor["cpu_us_per_req"]:
            line += (f"; lameduck {lame['cpu_us_per_req']:.1f} µs/req, "
                     f"{lame['cpu_us_per_req'] - floor['cpu_us_per_req']:+.1f} µs over the "
                     f"floor ({lame['cpu_us_per_req'] / floor['cpu_us_per_req']:.2f}x); req/s "
                     + ("n/s (not both saturated)" if (r := rps_ratio(lame, floor)) is None
                        else f"{r:.2f}x the floor's"))
        info.append(line)
    return rows, info, notes, failures


def shapes_intro(args: argparse.Namespace) -> str:
    warm = (f", after a {args.shapes_warmup:g} s warm-up each" if args.shapes_warmup > 0
            else "")
    return (
        f"wrk -t{args.threads} -c{args.connections} keep-alive GET <shape's path> against "
        f"{', '.join(args.shapes_names)} and the floor relay (keep-alive only), "
        f"{args.shapes_duration:g} s per proxy and shape in each of the {args.rounds} HTTP/1.1 "
        f"rounds (after that round's first-table rows, shapes and proxies in rotating "
        f"order){warm}. Proxies and the floor relay on CPU {args.proxy_cpu}; the origins and "
        f"wrk on CPU {args.load_cpu}: `plain` from HAProxy answering by itself (`http-request "
        "return`, one thread), the other shapes from one nginx process. Each proxy reaches "
        "each origin through a listener/frontend of its own configured as the first table's "
        "(both add X-Forwarded-For); the floor relay (bench/floor_relay.py) forwards bytes on "
        "one upstream connection per client connection and adds nothing.")


def print_shapes(shapes, args: argparse.Namespace) -> None:
    rows, info, notes, failures = shapes
    print()
    print(f"HTTP/1.1 response shapes (wrk -t{args.threads} -c{args.connections}; "
          f"{args.shapes_duration:g} s per row in each HTTP/1.1 round)")
    print(text_table(rows, SHAPES_HEADERS, left=2))
    for x in notes:
        print("  " + x)
    print()
    print("no target for the shapes (informational):")
    for x in info:
        print("  " + x)
    for f in failures:
        print("  failed: " + f)


def shapes_markdown(shapes, part: ShapesPart, args: argparse.Namespace) -> list[str]:
    rows, info, notes, failures = shapes
    return [
        "## HTTP/1.1 response shapes",
        "",
        shapes_intro(args),
        "",
        "What each origin sent (a raw socket, two GETs on one connection):",
        "",
        *[f"- `{s.label}` (`GET {s.path}`): {part.wire.get(s.label, 'not checked')}"
          for s in SHAPES],
        "",
        md_table(rows, SHAPES_HEADERS),
        "",
        *[f"{x}.\n" for x in notes],
        "No target is set for the shapes; for information:",
        "",
        *[f"- {x}" for x in info],
        "",
        *[f"Failed: {f}\n" for f in failures],
        *[f"Note: {n}.\n" for n in part.notes],
        "Each row is one proxy (lameduck, or the floor relay) beside HAProxy on the same "
        "shape: medians over the rounds, CPU µs/req = the proxy's utime+stime over the round / "
        "requests wrk completed; *errors*, *load CPU* and *limit* read proxy / HAProxy. "
        + limit_text(args),
        "",
        "### Shape rounds",
        "",
        md_table([[r[0], s.shape, *r[1:]] for s, r in
                  zip(part.samples, round_rows(part.samples, args), strict=True)],
                 [round_headers(args)[0], "shape", *round_headers(args)[1:]]),
        "",
    ]


# --------------------------------------------------------------------------------------------
# --workers: lameduck's `workers: N` (a main process and N data-plane worker processes, its
# children) against `workers: 1`. Two parts: "split", both pinned to the proxy CPU (what the
# split costs per request: the same core does the same work, plus the main process and the
# switching between processes), then "scale", lameduck, an nginx origin and wrk all spread over
# every allowed CPU (how far N processes take req/s on this machine, and what limited it).
# --------------------------------------------------------------------------------------------

SPLIT, SCALE = "split", "scale"
TARGET_SPLIT = 0.10  # workers: N on one core: at most 10 % more CPU per request
TARGET_SPLIT_LINE = (f"target (workers): lameduck's CPU per request with workers: N pinned to "
                     f"one core within {TARGET_SPLIT:.0%} of workers: 1 on that core (same run)")

def start_workers_origin(procs: Procs, cpus: str, workdir: Path,
                         processes: int) -> tuple[Proc, int]:
    """nginx answering ``GET /`` with HELLO, ``processes`` workers spread over ``cpus``: the
    single-process demo origin (or a one-process nginx) would be the limit there."""
    return start_nginx_origin(procs, "workers-origin", cpus, workdir, processes=processes)


def _pid_start(pid: int) -> str:
    return _stat_fields(pid)[19]  # field 22, starttime: tells a reused pid apart


def _running(pid: int, start: str) -> bool:
    try:
        f = _stat_fields(pid)
    except (OSError, IndexError):
        return False
    return f[19] == start and f[0] != "Z"


# How long stop_tree gives a stopped process's descendants to exit before it kills them.
TREE_GRACE = 5.0


def stop_tree(procs: Procs, proc: Proc, grace: float = TREE_GRACE) -> list[int]:
    """Stop ``proc`` by its pid (lameduck's main process and nginx's master stop their own
    workers), then any descendant still running after ``grace``, by its pid too (checked
    against its start time, so no reused pid is hit). The pids that had to be killed."""
    kids = []
    for pid in _tree(proc.pid)[1:]:
        with contextlib.suppress(OSError, IndexError):
            kids.append((pid, _pid_start(pid)))
    procs.stop(proc)
    end = time.monotonic() + grace
    while any(_running(*k) for k in kids) and time.monotonic() < end:
        time.sleep(0.05)
    killed = []
    for pid, start in kids:
        if _running(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def lameduck_workers(proc: Proc) -> list[dict]:
    """``/server_info``'s ``workers``: index, pid, ready, ... of each worker process."""
    return lameduck_admin(proc, "/server_info").get("workers", [])


def worker_counters(proc: Proc) -> dict[str, int]:
    """``worker.<i>.downstream_rq_total`` and ``_cx_total`` (what each worker served and
    accepted) and ``server.workers_replaced`` from ``/stats?format=json``."""
    out = {}
    for st in lameduck_admin(proc, "/stats?format=json")["stats"]:
        name = st.get("name", "")
        if name.startswith("worker.") or name == "server.workers_replaced":
            out[name] = st["value"]
    return out


@dataclass
class WorkerSample:
    part: str  # SPLIT or SCALE
    workers: int
    round: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_us_per_req: float  # the main process and its workers together
    main_us_per_req: float  # the main process alone (0 with workers: 1: there is none)
    proxy_cpu_pct: float  # lameduck's CPU over the round's wall time: 100 = one core
    main_cpu_pct: float
    worker_cpu_pct: list[float]  # each worker process's, by index
    origin_cpu_pct: float
    wrk_cpu_pct: float
    cpu_pct: dict[int, float]  # how busy each allowed CPU was
    served: list[int]  # requests each worker took in the round (its downstream_rq_total)
    accepted: list[int]  # connections each worker accepted in the round (downstream_cx_total)


def _rusage_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure_workers(procs: Procs, part: str, n: int, proxy: Proc, port: int, origin: Proc,
                    args: argparse.Namespace, rnd: int, load: int | str,
                    threads: int) -> WorkerSample:
    """One wrk round against lameduck with ``workers: n``: the CPU of its main process and of
    each worker (by pid, from /server_info), of the origin (its process tree) and of wrk (this
    script's reaped children: wrk is the only one reaped meanwhile), how busy each CPU was,
    and how many requests and connections each worker took (/stats before and after, outside
    the window)."""
    pids = {w["index"]: w["pid"] for w in lameduck_workers(proxy)} if n > 1 else {}
    if n > 1 and sorted(pids) != list(range(n)):
        raise BenchError(f"workers: {n}: /server_info lists workers {sorted(pids)}")
    c0 = worker_counters(proxy) if n > 1 else {}
    busy0, tree0, main0 = cpu_busy(), cpu_ticks(proxy.pid), proc_ticks(proxy.pid)
    w0 = {i: proc_ticks(p) for i, p in pids.items()}
    o0, ru0, t0 = cpu_ticks(origin.pid), _rusage_children(), time.monotonic()
    out = run_wrk(procs, load, port, args.workers_duration, args.connections, threads)
    busy1, tree1, main1 = cpu_busy(), cpu_ticks(proxy.pid), proc_ticks(proxy.pid)
    try:
        w1 = {i: proc_ticks(p) for i, p in pids.items()}
    except (OSError, IndexError) as e:
        raise BenchError(f"workers: {n}: a worker process is gone after round {rnd} ({e}); "
                         f"log tail ({proxy.log}):\n{proxy.tail()}") from None
    o1, ru1, wall = cpu_ticks(origin.pid), _rusage_children(), time.monotonic() - t0
    if not proxy.alive():
        raise BenchError(f"workers: {n} died during round {rnd}; log tail ({proxy.log}):\n"
                         f"{proxy.tail()}")
    c1 = worker_counters(proxy) if n > 1 else {}
    if c1.get("server.workers_replaced", 0) > c0.get("server.workers_replaced", 0):
        raise BenchError(f"workers: {n}: a worker was replaced during round {rnd}; log tail "
                         f"({proxy.log}):\n{proxy.tail()}")
    w = parse_wrk(out)
    reqs = max(1, int(w["requests"]))

    def pct(ticks: int) -> float:
        return 100.0 * ticks / CLK_TCK / wall

    def delta(what: str) -> list[int]:
        return [c1.get(f"worker.{i}.downstream_{what}_total", 0)
                - c0.get(f"worker.{i}.downstream_{what}_total", 0) for i in range(n)]

    return WorkerSample(
        part=part, workers=n, round=rnd, requests=int(w["requests"]), rps=w["rps"],
        p50_ms=w["p50_ms"], p99_ms=w["p99_ms"], errors=int(w["errors"]),
        cpu_us_per_req=(tree1 - tree0) / CLK_TCK * 1e6 / reqs,
        main_us_per_req=(main1 - main0) / CLK_TCK * 1e6 / reqs if n > 1 else 0.0,
        proxy_cpu_pct=pct(tree1 - tree0), main_cpu_pct=pct(main1 - main0) if n > 1 else 0.0,
        worker_cpu_pct=[pct(w1[i] - w0[i]) for i in range(n)] if n > 1 else [],
        origin_cpu_pct=pct(o1 - o0), wrk_cpu_pct=100.0 * (ru1 - ru0) / wall,
        cpu_pct=busy_pct(busy0, busy1, (c for c in sorted(busy1) if c in busy0)),
        served=delta("rq") if n > 1 else [], accepted=delta("cx") if n > 1 else [],
    )


def _shares(served: list[int]) -> str:
    total = sum(served)
    if not served or not total:
        return "-"
    return " ".join(f"{100.0 * x / total:.0f}%" for x in served)


def _round_line(s: WorkerSample) -> str:
    split = " ".join(f"w{i} {p:.0f}%" for i, p in enumerate(s.worker_cpu_pct))
    return (f"round {s.round} workers {s.part} {s.workers:>2} {s.rps:>10,.0f} req/s  "
            f"p50 {s.p50_ms:6.2f} ms  p99 {s.p99_ms:6.2f} ms  {s.cpu_us_per_req:6.1f} µs/req  "
            f"lameduck {s.proxy_cpu_pct:3.0f}%"
            + (f" (main {s.main_cpu_pct:.1f}%, {split})" if s.workers > 1 else "")
            + f"  origin {s.origin_cpu_pct:3.0f}%  wrk {s.wrk_cpu_pct:3.0f}%  "
            + " ".join(f"cpu{c} {p:3.0f}%" for c, p in s.cpu_pct.items())
            + (f"  requests per worker {_shares(s.served)} (connections "
               f"{'/'.join(map(str, s.accepted))})" if s.served else "")
            + f"  errors {s.errors}")


def run_workers_part(procs: Procs, part: str, args: argparse.Namespace, workdir: Path,
                     origin: Proc, origin_port: int, cpus: str, load: int | str,
                     threads: int, samples: list[WorkerSample], notes: list[str]) -> None:
    """lameduck with each of ``args.worker_counts`` on ``cpus`` in front of ``origin``: a
    keep-alive pre-check, a wrk warm-up each, then ``--rounds`` interleaved rounds (order
    rotating), wrk on ``load``. Every lameduck is stopped before it returns, its workers too;
    BenchError when anything failed."""
    instances: dict[int, tuple[Proc, int]] = {}
    try:
        for n in args.worker_counts:
            proc, port = start_lameduck(procs, cpus, workdir, origin_port, workers=n,
                                        name=f"lameduck-w{n}-{part}")
            instances[n] = (proc, port)
            if n > 1:
                wait_until(proc, f"{n} workers ready in /server_info", lambda p=proc, k=n: (
                    len(ws := lameduck_workers(p)) == k and all(w["ready"] for w in ws)))
            problem = keepalive_check(port)
            if problem:
                raise BenchError(f"workers: {n} ({part}) failed the keep-alive pre-check "
                                 f"({problem}); log tail ({proc.log}):\n{proc.tail()}")
            pids = " ".join(str(w["pid"]) for w in lameduck_workers(proc)) if n > 1 else ""
            print(f"lameduck workers: {n} ({part}): pid {proc.pid} on 127.0.0.1:{port} "
                  f"(CPUs {cpus})" + (f", worker pids {pids}" if pids else ""), flush=True)
        if args.workers_warmup > 0:
            for n, (_, port) in instances.items():
                print(f"warm-up workers {part} {n} {args.workers_warmup:g}s", flush=True)
                run_wrk(procs, load, port, args.workers_warmup, args.connections, threads)
        counts = list(instances)
        for rnd in range(1, args.rounds + 1):
            k = (rnd - 1) % len(counts)
            for n in counts[k:] + counts[:k]:
                proc, port = instances[n]
                s = measure_workers(procs, part, n, proc, port, origin, args, rnd, load,
                                    threads)
                samples.append(s)
                print(_round_line(s), flush=True)
                if not origin.alive():
                    raise BenchError(f"the origin exited (code {origin.popen.returncode}) in "
                                     f"round {rnd}; its log tail ({origin.log}):\n"
                                     f"{origin.tail(15)}")
        for n in counts:
            ss = [s for s in samples if s.part == part and s.workers == n]
            if n > 1 and ss:
                served, done = sum(sum(s.served) for s in ss), sum(s.requests for s in ss)
                # wrk counts responses, lameduck requests received: they differ by what was
                # in flight at each round's end (at most --connections per round)
                if abs(served - done) > args.connections * len(ss):
                    notes.append(f"CHECK FAILED ({part}, workers: {n}): the workers' "
                                 f"downstream_rq_total rose by {served:,} over the rounds, "
                                 f"wrk counted {done:,} responses")
    finally:
        for n, (proc, _) in instances.items():
            killed = stop_tree(procs, proc)
            if killed:
                notes.append(f"workers: {n} ({part}): worker pid(s) {killed} still ran "
                             f"{TREE_GRACE:g} s after the main process was stopped: killed")


@dataclass
class WorkersResult:
    samples: list[WorkerSample] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    cpus: str = ""
    threads: int = 1


def run_workers(procs: Procs, args: argparse.Namespace, workdir: Path, origin: Proc,
                origin_port: int) -> WorkersResult:
    """Both parts; a part that fails is a line in ``failures``, not an exception."""
    res = WorkersResult()
    allowed = sorted(os.sched_getaffinity(0))
    res.cpus = ",".join(map(str, allowed))
    res.threads = args.workers_threads or max(args.threads, len(allowed) // 4)
    try:
        run_workers_part(procs, SPLIT, args, workdir, origin, origin_port,
                         str(args.proxy_cpu), args.load_cpu, args.threads, res.samples,
                         res.notes)
    except BenchError as e:
        res.failures.append(f"{SPLIT}: {e}")
        print(f"bench: warning: workers {SPLIT}: {e}", file=sys.stderr)
    try:
        nginx, port = start_workers_origin(procs, res.cpus, workdir, len(allowed))
        print(f"workers origin (nginx, {len(allowed)} processes): pid {nginx.pid} on "
              f"127.0.0.1:{port} (CPUs {res.cpus})", flush=True)
        try:
            run_workers_part(procs, SCALE, args, workdir, nginx, port, res.cpus, res.cpus,
                             res.threads, res.samples, res.notes)
        finally:
            stop_tree(procs, nginx)
    except BenchError as e:
        res.failures.append(f"{SCALE}: {e}")
        print(f"bench: warning: workers {SCALE}: {e}", file=sys.stderr)
    return res


def _main_cost(ss: list[WorkerSample]) -> tuple[float, float]:
    """The main process's µs per request and % of a core over all the rounds together (a
    round holds only a few of its clock ticks)."""
    reqs = sum(s.requests for s in ss)
    us = sum(s.main_us_per_req * s.requests for s in ss) / max(1, reqs)
    return us, statistics.mean(s.main_cpu_pct for s in ss)


def scale_limit(ss: list[WorkerSample], threads: int) -> str:
    """What limited a scale row (medians over its rounds): a single-threaded process at a
    full core (lameduck's one process, every worker, wrk's threads), all cores busy, or none
    of these (then latency: a fixed number of connections, each one request at a time)."""
    n = ss[0].workers
    why = []
    if n == 1 and _median(ss, "proxy_cpu_pct") >= SATURATED:
        why.append("lameduck's one process at a full core")
    if n > 1:
        full = sum(statistics.median(s.worker_cpu_pct[i] for s in ss) >= SATURATED
                   for i in range(n))
        if full:
            why.append(f"{full} of {n} workers at a full core")
    if _median(ss, "wrk_cpu_pct") >= SATURATED * threads:
        why.append(f"wrk (-t{threads}) at {threads} full core{'s' if threads > 1 else ''}")
    cores = ss[0].cpu_pct.keys()
    busy = [c for c in cores if statistics.median(s.cpu_pct[c] for s in ss) >= SATURATED]
    if busy and len(busy) == len(cores):
        why.append(f"all {len(cores)} cores busy")
    elif busy:
        why.append(" ".join(f"cpu{c}" for c in busy) + " busy")
    return " + ".join(why) or "no core saturated"


WORKERS_SPLIT_HEADERS = ["workers", "req/s (median)", "p50", "p99", "CPU µs/req",
                         "vs workers: 1", "main µs/req", "main CPU", "per worker CPU",
                         "requests per worker", "connections per worker", "errors",
                         "lameduck CPU", "load CPU", "limit"]
WORKERS_SCALE_HEADERS = ["workers", "req/s (median)", "p50", "p99", "CPU µs/req",
                         "vs workers: 1 req/s", "lameduck CPU", "origin CPU", "wrk CPU",
                         "other", "cores busy", "requests per worker",
                         "connections per worker", "errors", "limited by"]


def summarize_workers(res: WorkersResult, args: argparse.Namespace,
                      ) -> tuple[list[list[str]], list[list[str]], list[str], list[str]]:
    """The split rows, the scale rows, the split verdict lines and the scale lines."""
    split_rows, scale_rows, verdict, info = [], [], [], []
    for part in (SPLIT, SCALE):
        by_n = {n: [s for s in res.samples if s.part == part and s.workers == n]
                for n in args.worker_counts}
        base = by_n.get(1)
        for n, ss in by_n.items():
            if not ss:
                continue
            cpu, rps = _median(ss, "cpu_us_per_req"), _median(ss, "rps")
            served = [sum(s.served[i] for s in ss) for i in range(n)] if n > 1 else []
            accepted = "/".join(str(sum(s.accepted[i] for s in ss))
                                for i in range(n)) if n > 1 else "-"
            per_worker = " ".join(f"{statistics.median(s.worker_cpu_pct[i] for s in ss):.0f}%"
                                  for i in range(n)) if n > 1 else "-"
            head = [str(n), f"{rps:,.0f}", f"{_median(ss, 'p50_ms'):.2f} ms",
                    f"{_median(ss, 'p99_ms'):.2f} ms", f"{cpu:.1f}"]
            errors = str(sum(s.errors for s in ss))
            main_us, main_pct = _main_cost(ss)
            if part == SPLIT:
                ratio = cpu / _median(base, "cpu_us_per_req") if base else None
                lam = _median(ss, "proxy_cpu_pct")
                load = statistics.median(s.cpu_pct[args.load_cpu] for s in ss)
                split_rows.append([
                    *head, f"{ratio:.2f}x" if ratio else "n/a",
                    f"{main_us:.2f}" if n > 1 else "-",
                    f"{main_pct:.1f}%" if n > 1 else "-", per_worker,
                    _shares(served), accepted, errors, f"{lam:.0f}%", f"{load:.0f}%",
                    bound_by(lam, load, args.load_cpu)])
                if n > 1 and ratio:
                    paired = [s.cpu_us_per_req / b.cpu_us_per_req - 1 for s in ss for b in base
                              if b.round == s.round and b.cpu_us_per_req]
                    verdict.append(
                        f"workers: {n} on CPU {args.proxy_cpu}: {cpu:.1f} µs CPU/request vs "
                        f"{_median(base, 'cpu_us_per_req'):.1f} with workers: 1 "
                        f"({ratio - 1:+.1%}; {'met' if ratio <= 1 + TARGET_SPLIT else 'NOT met'}"
                        f": within {TARGET_SPLIT:.0%}); its main process alone "
                        f"{main_us:.2f} µs/request ({main_pct:.1f}% of a core; all rounds); "
                        f"round by round: " + ", ".join(f"{x:+.0%}" for x in paired))
            else:
                lam, org, wrk = (_median(ss, k) for k in ("proxy_cpu_pct", "origin_cpu_pct",
                                                       "wrk_cpu_pct"))
                total = statistics.median(sum(s.cpu_pct.values()) for s in ss)
                limit = scale_limit(ss, res.threads)
                scale_rows.append([
                    *head, f"{rps / _median(base, 'rps'):.2f}x" if base else "n/a",
                    f"{lam:.0f}%" + (f" (main {main_pct:.1f}%)" if n > 1 else ""),
                    f"{org:.0f}%", f"{wrk:.0f}%", f"{max(0.0, total - lam - org - wrk):.0f}%",
                    " ".join(f"cpu{c} {statistics.median(s.cpu_pct[c] for s in ss):.0f}%"
                             for c in ss[0].cpu_pct),
                    _shares(served), accepted, errors, limit])
                info.append(f"workers: {n} over CPUs {res.cpus}: {rps:,.0f} req/s"
                            + (f", {rps / _median(base, 'rps'):.2f}x workers: 1" if base and n > 1
                               else "") + f"; limited by: {limit}")
    return split_rows, scale_rows, verdict, info


def workers_round_rows(res: WorkersResult) -> list[list[str]]:
    return [[s.part, str(s.round), str(s.workers), f"{s.rps:,.0f}", f"{s.p50_ms:.2f}",
             f"{s.p99_ms:.2f}", f"{s.cpu_us_per_req:.1f}",
             f"{s.main_us_per_req:.2f}" if s.workers > 1 else "-",
             f"{s.proxy_cpu_pct:.0f}%", " ".join(f"{p:.0f}%" for p in s.worker_cpu_pct) or "-",
             f"{s.origin_cpu_pct:.0f}%", f"{s.wrk_cpu_pct:.0f}%",
             " ".join(f"cpu{c} {p:.0f}%" for c, p in s.cpu_pct.items()),
             _shares(s.served), "/".join(map(str, s.accepted)) or "-", str(s.errors)]
            for s in res.samples]


WORKERS_ROUND_HEADERS = ["part", "round", "workers", "req/s", "p50 ms", "p99 ms", "CPU µs/req",
                         "main µs/req", "lameduck CPU", "per worker CPU", "origin CPU",
                         "wrk CPU", "cores busy", "requests per worker",
                         "connections per worker", "errors"]


def workers_titles(res: WorkersResult, args: argparse.Namespace) -> tuple[str, str]:
    return (
        f"lameduck workers: N vs workers: 1, all pinned to CPU {args.proxy_cpu} (main process "
        f"and workers); origin ({args.origin}) and wrk -t{args.threads} -c{args.connections} "
        f"on CPU {args.load_cpu}; {args.workers_duration:g} s rounds",
        f"lameduck workers: N vs workers: 1 spread over CPUs {res.cpus}, with an nginx origin "
        f"(one process per CPU) and wrk -t{res.threads} -c{args.connections} on the same "
        f"CPUs; {args.workers_duration:g} s rounds")


def print_workers(res: WorkersResult, args: argparse.Namespace) -> None:
    split_rows, scale_rows, verdict, info = summarize_workers(res, args)
    split_title, scale_title = workers_titles(res, args)
    if split_rows:
        print()
        print(split_title)
        print(text_table(split_rows, WORKERS_SPLIT_HEADERS))
        print()
        print(TARGET_SPLIT_LINE)
        for v in verdict:
            print("  " + v)
    if scale_rows:
        print()
        print(scale_title)
        print(text_table(scale_rows, WORKERS_SCALE_HEADERS))
        print()
        print("scaling (informational; lameduck, origin and wrk CPU in % of one core, "
              "other = the rest of the cores' busy time, other jobs included):")
        for x in info:
            print("  " + x)
    for f in res.failures:
        print("  failed: workers " + f)
    for n in res.notes:
        print("note: " + n)


def workers_markdown(res: WorkersResult, args: argparse.Namespace) -> list[str]:
    split_rows, scale_rows, verdict, info = summarize_workers(res, args)
    split_title, scale_title = workers_titles(res, args)
    out = ["## lameduck workers", ""]
    if split_rows:
        out += [split_title + ":", "", md_table(split_rows, WORKERS_SPLIT_HEADERS), "",
                TARGET_SPLIT_LINE + ":", "", *[f"- {v}" for v in verdict], ""]
    if scale_rows:
        out += [scale_title + ":", "", md_table(scale_rows, WORKERS_SCALE_HEADERS), "",
                *[f"- {x}" for x in info], ""]
    out += [*[f"Failed: workers {f}\n" for f in res.failures],
            *[f"Note: {n}.\n" for n in res.notes],
            "*CPU µs/req*: lameduck's main process and workers together (utime+stime of the "
            "process tree) over the requests wrk completed, median of the rounds; *main*: the "
            "main process alone, over all the rounds together (a 5 s round holds only a few "
            "of its 10 ms clock ticks). "
            "*requests per worker*: each worker's share of `worker.<i>.downstream_rq_total` "
            "(`/stats`) over the rounds; *connections per worker*: `worker.<i>."
            "downstream_cx_total` summed over the rounds (wrk opens its connections anew each "
            "round; the kernel hands each to whichever worker accepts first). CPU figures in % "
            "of one core.", "",
            "### Rounds", "", md_table(workers_round_rows(res), WORKERS_ROUND_HEADERS), ""]
    return out


def _on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for tool in ("taskset", "wrk",
                 *(["haproxy"] if "haproxy" in args.names or args.shapes_names else []),
                 *(["nginx"] if "nginx" in args.names or args.h2up_names or args.shapes_names
                   or args.worker_counts or args.origin == "nginx" else []),
                 *(["h2load"] if args.h2_names or args.h3_names else []),
                 *(["curl"] if args.h2up_names or args.h2_names else []),
                 *(["openssl"] if args.tls_names or args.h3_names else [])):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            print(f"bench: {tool} not found (make bench installs wrk, haproxy, nginx-light, "
                  "nghttp2-client; --no-h2 skips the h2load rows, --no-h2-upstream the rows "
                  "through the nginx h2c origin, which need curl as the h2 rows do; "
                  "--no-shapes the response-shape matrix, whose origins are nginx and "
                  "HAProxy; --no-h3 the HTTP/3 rows, which need h2load and openssl)",
                  file=sys.stderr)
            return 2
    os.environ["PATH"] += os.pathsep + "/usr/sbin:/sbin"
    exe = Path(sys.executable)
    with contextlib.suppress(ValueError):
        exe = exe.relative_to(REPO)
    command = " ".join([str(exe), "bench/run.py", *(argv or sys.argv[1:])])

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGHUP, _on_sigterm)
    workdir = Path(tempfile.mkdtemp(prefix="lameduck-bench-"))
    procs = Procs(workdir)
    if args.proxy_quota is not None:
        global PROXY_SATURATED
        try:
            procs.quota = CpuQuota(args.proxy_quota)
        except BenchError as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
        procs.quota_cpu = args.proxy_cpu
        PROXY_SATURATED = PROXY_SATURATED * args.proxy_quota / 100
    keep = args.keep
    samples: list[Sample] = []
    h2_samples: list[H2Sample] = []
    h2_skipped: dict[str, str] = {}  # proxy -> why its h2 rounds did not run
    counters: dict[str, int] = {}
    h2up_samples: list[Sample] = []
    h2up_skipped: dict[str, str] = {}  # proxy -> why its h2-upstream row is FAILED
    h2up_notes: list[str] = []
    pool_samples: list[Sample] = []
    pool_skipped: dict[str, str] = {}  # proxy -> why its pool row is FAILED
    pool_notes: list[str] = []
    tls_samples: list[Sample] = []
    tls_skipped: dict[str, str] = {}  # proxy -> why its TLS row is FAILED
    tls_notes: list[str] = []
    tls_files: tuple[Path, Path, Path] | None = None
    h3_part: H3Part | None = None
    shapes_part: ShapesPart | None = None
    workers: WorkersResult | None = None
    idle = background_load((args.proxy_cpu, args.load_cpu))
    notes = []
    if max(idle.values()) > 10:
        notes.append("machine not idle before the run: " + ", ".join(
            f"cpu{c} {pct:.0f}% busy" for c, pct in idle.items())
            + " (other jobs were running; expect noisy numbers)")
        print(f"bench: warning: {notes[-1]}", file=sys.stderr)
    if procs.quota is not None:
        notes.append(f"--proxy-quota {args.proxy_quota}: every proxy ran in a cgroup of its "
                     f"own capped at {args.proxy_quota}% of CPU {args.proxy_cpu} (CFS quota), "
                     f"so a proxy is saturated at >= {PROXY_SATURATED:g}% of a core (85% of "
                     "its quota); proxy CPU columns are % of a whole core")
    try:
        # What each lameduck measured is (inside the try: a missing one fails as bench: ...)
        if "lameduck" in args.names or args.worker_counts:
            args.builds["lameduck"] = lameduck_build(lameduck_bin())
        if args.lameduck_base:
            args.builds[BASE] = lameduck_build(args.lameduck_base)
        for name, build in args.builds.items():
            print(f"{name}: {build}")
        origin, origin_port = start_main_origin(procs, args, workdir)
        args.origin_info = origin_headers(origin_port)
        print(f"origin ({args.origin}): pid {origin.pid} on 127.0.0.1:{origin_port} "
              f"(CPU {args.load_cpu}); GET / -> {args.origin_info}")
        h2_origin, h2_origin_port = None, 0
        if args.h2up_names:
            try:
                h2_origin, h2_origin_port = start_h2_origin(procs, args.load_cpu, workdir)
                print(f"h2c origin (nginx): pid {h2_origin.pid} on 127.0.0.1:{h2_origin_port} "
                      f"(CPU {args.load_cpu}), answers curl --http2-prior-knowledge")
            except BenchError as e:  # the other parts still run; these rows read FAILED
                keep = True
                for n in args.h2up_names:
                    h2up_skipped[n] = f"no h2c origin: {e}"
                print(f"bench: warning: no h2c origin, no HTTP/2-upstream rounds: {e}",
                      file=sys.stderr)
        pool_origins: list[Proc] = []
        pool_ports: tuple[int, ...] = ()
        if args.pool_names:
            try:
                for i in range(1, POOL_SIZE + 1):
                    o, o_port = start_main_origin(procs, args, workdir, f"pool-origin{i}")
                    pool_origins.append(o)
                    pool_ports += (o_port,)
                print("pool origins: " + ", ".join(
                    f"pid {o.pid} on 127.0.0.1:{o_port}"
                    for o, o_port in zip(pool_origins, pool_ports, strict=True))
                    + f" ({args.origin}, CPU {args.load_cpu})")
            except BenchError as e:  # the other parts still run; these rows read FAILED
                keep = True
                for o in pool_origins:
                    procs.stop(o)
                pool_origins, pool_ports = [], ()
                for n in args.pool_names:
                    pool_skipped[n] = f"no pool origins: {e}"
                print(f"bench: warning: no pool origins, no pool rounds: {e}", file=sys.stderr)
        if args.shapes_names:
            shapes_part = start_shapes(procs, args, workdir)
            if shapes_part.skipped:
                keep = True
            for kind, (o, o_port) in shapes_part.origins.items():
                print(f"shapes origin ({kind}): pid {o.pid} on 127.0.0.1:{o_port} "
                      f"(CPU {args.load_cpu})")
            for shape in SHAPES:
                print(f"  {shape.label:10} GET {shape.path:11} -> "
                      f"{shapes_part.wire.get(shape.label, 'FAILED')}")
            if shapes_part.floor:
                print(f"floor relay: pid {shapes_part.floor[0].pid} on "
                      f"127.0.0.1:{shapes_part.floor[1]} (CPU {args.proxy_cpu})")
        if args.tls_names or args.h3_names:
            try:
                tls_files = make_tls_files(workdir)
            except (BenchError, OSError) as e:  # the other parts still run; these read FAILED
                keep = True
                for n in args.tls_names:
                    tls_skipped[n] = f"no certificate: {e}"
                if args.h3_names:
                    h3_part = H3Part(quota_pct=None, saturated_at=QUOTA_SATURATED,
                                     failed=f"no certificate: {e}")
                print(f"bench: warning: no TLS or HTTP/3 rounds: {e}", file=sys.stderr)
        proxies: dict[str, tuple[Proc, int]] = {}
        for name in args.names:
            kw: dict = {"h2": True} if name in args.h2_names else {}
            if name in args.h2up_names and h2_origin_port:
                kw["h2up_origin_port"] = h2_origin_port
            # lameduck-base gets lameduck's config whole (its pool listener too, health checks
            # running, though its pool row is not measured)
            if pool_ports and (name in args.pool_names
                               or (name == BASE and "lameduck" in args.pool_names)):
                kw["pool_origin_ports"] = pool_ports
            if shapes_part and name in args.shapes_names:
                kw["shapes_origin_port"] = shapes_part.origins.get("nginx", (None, 0))[1]
                kw["plain_origin_port"] = shapes_part.origins.get("plain", (None, 0))[1]
            if tls_files and name in args.tls_names:  # (HTTP/3's lameduck is started later)
                if name == "haproxy":
                    kw["tls_pem"] = tls_files[2]
                else:
                    kw["tls_files"] = tls_files[:2]
            if name == BASE:
                kw.update(name=BASE, binary=args.lameduck_base)
            starter = STARTERS[name if name != BASE else "lameduck"]
            proc, port = starter(procs, args.proxy_cpu, workdir, origin_port, **kw)
            proxies[name] = (proc, port)
            print(f"{name}: pid {proc.pid} on 127.0.0.1:{port} (CPU {args.proxy_cpu})"
                  + (f", h2c on :{proc.h2_port}" if proc.h2_port else "")
                  + (f", h2c-upstream listener on :{proc.h2up_port}" if proc.h2up_port
                     else "")
                  + (f", pool listener on :{proc.pool_port}" if proc.pool_port else "")
                  + (f", shapes listener on :{proc.shapes_port}" if proc.shapes_port else "")
                  + (f", plain shape listener on :{proc.plain_port}" if proc.plain_port
                     else "")
                  + (f", TLS listener on :{proc.tls_port}" if proc.tls_port else ""))
        for name, (proc, port) in proxies.items():
            problem = keepalive_check(port)
            if problem:
                notes.append(f"{name} failed the keep-alive pre-check ({problem}); "
                             "its numbers below measure that failure")
                print(f"bench: warning: {notes[-1]}\n{name} log tail ({proc.log}):\n"
                      f"{proc.tail()}", file=sys.stderr)
                keep = True
        if args.warmup > 0:
            for name, (_, port) in proxies.items():
                print(f"warm-up {name} {args.warmup:g}s", flush=True)
                run_wrk(procs, args.load_cpu, port, args.warmup, args.connections, args.threads)
        if shapes_part:
            prepare_shapes(procs, proxies, args, shapes_part)
            keep = keep or bool(shapes_part.skipped)
        for rnd in range(1, args.rounds + 1):
            k = (rnd - 1) % max(1, len(args.names))
            order = args.names[k:] + args.names[:k]  # rotate so no proxy always goes first
            for name in order:
                proc, port = proxies[name]
                s = measure(procs, name, proc, port, args, rnd)
                samples.append(s)
                print(f"round {rnd} {name:13} {s.rps:>10,.0f} req/s  p50 {s.p50_ms:6.2f} ms  "
                      f"p99 {s.p99_ms:6.2f} ms  {s.cpu_us_per_req:6.1f} µs/req  "
                      f"proxy CPU {s.proxy_cpu_pct:3.0f}%  cpu{args.load_cpu} "
                      f"{s.cpu_pct[args.load_cpu]:3.0f}%  errors {s.errors}", flush=True)
            if shapes_part and not run_shapes_round(procs, args, shapes_part, rnd):
                keep = True
        for name, (proc, _) in proxies.items():
            if not proc.alive():
                raise BenchError(f"{name} exited; log tail:\n{proc.tail()}")
        lameduck = proxies.get("lameduck")
        if lameduck:
            with contextlib.suppress(OSError, ValueError, KeyError):
                counters = lameduck_counters(lameduck[0])
            if shapes_part and "lameduck" in args.shapes_names:
                with contextlib.suppress(OSError, ValueError, KeyError):
                    c = lameduck_counters(lameduck[0], shapes=True)
                    shapes_part.notes.append(
                        "lameduck counters of its shape listeners and clusters after the "
                        "rounds (warm-up and pre-checks included): "
                        + ", ".join(f"{k}={v}" for k, v in c.items()))
        if args.h2_names and not run_h2_rounds(procs, proxies, args, workdir, h2_samples,
                                               h2_skipped):
            keep = True
            if lameduck and re.search(r"Traceback|ERROR|Exception", lameduck[0].tail(200)):
                print(f"bench: note: lameduck logged errors; tail of {lameduck[0].log}:\n"
                      f"{lameduck[0].tail(40)}", file=sys.stderr)
        if h2_origin is not None:
            if not run_h2up_rounds(procs, proxies, h2_origin, args, h2up_samples,
                                   h2up_skipped):
                keep = True
            if lameduck and lameduck[0].alive():
                with contextlib.suppress(OSError, ValueError, KeyError):
                    c = lameduck_counters(lameduck[0], h2up=True)
                    h2up_notes.append("lameduck counters of its h2c-upstream listener and "
                                      "cluster after the run (warm-up included): " + ", ".join(
                                          f"{k}={v}" for k, v in c.items()))
            bad = "lameduck" in h2up_skipped or any(
                s.errors for s in h2up_samples if s.proxy == "lameduck")
            if lameduck and bad:
                print(f"bench: note: lameduck's h2-upstream row failed or had errors; "
                      f"{h2up_notes[-1] if h2up_notes else 'no counters'}\n"
                      f"tail of {lameduck[0].log}:\n{lameduck[0].tail(40)}", file=sys.stderr)
        if pool_origins and not run_pool_rounds(procs, proxies, pool_origins, args,
                                                pool_samples, pool_skipped):
            keep = True
        if args.pool_names:
            pool_notes, checks_ok = pool_checks(proxies, args, pool_samples, pool_skipped)
            if not checks_ok:
                keep = True
                if lameduck and "lameduck" in args.pool_names:
                    print(f"bench: note: the pool checks failed; tail of {lameduck[0].log}:\n"
                          f"{lameduck[0].tail(40)}", file=sys.stderr)
        if tls_files and args.tls_names:
            negotiated = {}
            for n in args.tls_names:
                try:
                    negotiated[n] = tls_negotiated(proxies[n][0].tls_port)
                except (OSError, ssl.SSLError) as e:
                    tls_skipped.setdefault(n, f"TLS handshake: {type(e).__name__}: {e}")
            tls_notes.append("negotiated with OpenSSL's default client: " + ", ".join(
                f"{n} {v}" for n, v in negotiated.items()))
            print("tls: " + tls_notes[-1])
            problem = tls_cipher_problem(negotiated)
            if problem:
                tls_notes.append(problem + "; the CPU per request compares ciphers too")
                print(f"bench: warning: {problem}", file=sys.stderr)
            if not run_tls_rounds(procs, proxies, origin, args, tls_samples, tls_skipped):
                keep = True
            if lameduck and lameduck[0].alive():
                with contextlib.suppress(OSError, ValueError, KeyError):
                    c = lameduck_counters(lameduck[0], tls=True)
                    tls_notes.append("lameduck counters of its TLS listener after the run "
                                     "(warm-up and pre-checks included; a connection is a "
                                     "handshake): " + ", ".join(f"{k}={v}" for k, v in c.items()))
        if tls_files and args.h3_names:
            h3_part = run_h3_part(procs, args, workdir, origin, origin_port, tls_files)
            if h3_part.failed or h3_part.skipped or any(s.failed for s in h3_part.samples):
                keep = True
        if args.worker_counts:
            workers = run_workers(procs, args, workdir, origin, origin_port)
            if workers.failures or any(n.startswith("CHECK FAILED") for n in workers.notes):
                keep = True
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        keep = True
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted; stopping everything", file=sys.stderr)
        return 130
    finally:
        procs.stop_all()
        if procs.quota is not None:
            procs.quota.remove()
        if keep:
            print(f"bench: configs and logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    summary = summarize(samples, args.names, args.load_cpu)
    if args.names:
        print()
        print(f"HTTP/1.1 keep-alive GET / (wrk -t{args.threads} -c{args.connections}; "
              f"{args.duration:g} s rounds; origin: {args.origin})")
        print(text_table(summary.rows))
        for x in summary.notes:
            print("  " + x)
        print()
        print(TARGET_LINE)
        for v in summary.verdict:
            print("  " + v)
    shapes = None
    if shapes_part:
        shapes = summarize_shapes(shapes_part, args)
        print_shapes(shapes, args)
        for n in shapes_part.notes:
            print("note: " + n)
    elif args.shapes:
        notes.append("no response-shape rows: --proxies has neither lameduck nor haproxy")
    best = max((statistics.median(x.rps for x in samples if x.proxy == n) for n in args.names),
               default=0.0)
    for n in args.names:
        rps = statistics.median(x.rps for x in samples if x.proxy == n)
        if rps < 0.1 * best:
            notes.append(f"{n} ran at {rps:,.0f} req/s, under a tenth of the best proxy: "
                         "look for stalled connections rather than slowness")
    if counters:
        notes.append("lameduck counters after the run (warm-ups included): " + ", ".join(
            f"{k}={v}" for k, v in counters.items()))
    h2 = None
    if args.h2_names:
        h2_rows, h2_verdict, h2_failures, h2_notes = summarize_h2(
            h2_samples, args.h2_names, args.load_cpu, h2_skipped)
        h2 = (h2_rows, h2_verdict, h2_failures, h2_notes, h2_samples)
        print()
        print(f"HTTP/2 (h2c prior knowledge, h2load -t1; {args.h2_duration:g} s rounds; "
              + ", ".join(f"{label} = -c{c} -m{m}" for label, c, m in H2_SHAPES) + ")")
        print(text_table(h2_rows, H2_HEADERS, left=2))
        for x in h2_notes:
            print("  " + x)
        print()
        print(TARGET_H2_LINE)
        for v in h2_verdict:
            print("  " + v)
        for f in h2_failures:
            print("  failed: " + f)
    elif args.h2:
        notes.append("no HTTP/2 rows: --proxies has neither lameduck nor haproxy")
    if args.h2_upstream and not args.h2up_names:
        notes.append("no HTTP/2-upstream rows: --proxies has neither lameduck nor haproxy")
    for n in notes:
        print("note: " + n)
    h2up = None
    if args.h2up_names:
        up_rows, up_info, up_failures = summarize_h2up(h2up_samples, args.h2up_names,
                                                       args.load_cpu, h2up_skipped, samples)
        h2up = (up_rows, up_info, up_failures, h2up_samples, h2up_notes)
        print_part(f"HTTP/1.1 clients -> HTTP/2 (h2c) upstream (nginx origin; wrk "
                   f"-t{args.threads} -c{args.connections}; {args.h2up_duration:g} s rounds)",
                   up_rows, NO_TARGET_LINE, up_info, up_failures, h2up_notes)
    if args.pool and not args.pool_names:
        notes.append("no pool rows: --proxies has neither lameduck nor haproxy")
    pool = None
    if args.pool_names:
        pool_rows, pool_info, pool_failures = summarize_pool(
            pool_samples, args.pool_names, args.load_cpu, pool_skipped, samples)
        pool = (pool_rows, pool_info, pool_failures, pool_samples, pool_notes)
        print_part(f"HTTP/1.1 through a pool of {POOL_SIZE} origins (round robin, health checks "
                   f"on; wrk -t{args.threads} -c{args.connections}; {args.pool_duration:g} s "
                   "rounds)", pool_rows, NO_TARGET_LINE, pool_info, pool_failures, pool_notes)
    if args.tls and not args.tls_names:
        notes.append("no TLS rows: --proxies has neither lameduck nor haproxy")
    tls = None
    if args.tls_names:
        tls_rows, tls_info, tls_failures = summarize_tls(
            tls_samples, args.tls_names, args.load_cpu, tls_skipped, samples)
        tls = (tls_rows, tls_info, tls_failures, tls_samples, tls_notes)
        print_part(f"HTTPS keep-alive GET / (TLS in, plain HTTP/1.1 to the origin; wrk "
                   f"-t{args.threads} -c{args.connections}; {args.tls_duration:g} s rounds)",
                   tls_rows, TARGET_TLS_LINE, tls_info, tls_failures, tls_notes)
    h3 = None
    if h3_part is not None:
        h3 = (h3_part, print_h3(h3_part, args))
    if workers is not None:
        print_workers(workers, args)
    write_markdown(args.out, summary, samples, args, command, notes, h2, h2up, pool, workers,
                   (shapes, shapes_part) if shapes and shapes_part else None, tls, h3)
    print(f"\nwritten {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
