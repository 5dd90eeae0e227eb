#!/usr/bin/env python3
"""Resource bounds of lameduck, HAProxy and nginx, configured alike (bench/run.py's configs)
and measured in the same run, interleaved:

- idle: RSS per idle keep-alive connection. N connections each do one GET and stay open;
  VmRSS (/proc/<pid>/status, summed over the proxy's processes) before and after, over N.
- slow reader: a client asks for a 100 MB body (the demo origin's /bytes?n=) and reads none
  of it; the proxy's peak RSS growth while it holds that response shows whether flow control
  (write-buffer high-water marks, pausing the upstream read; HTTP/2 stream windows) bounds it.
  HTTP/1.1 for all three, HTTP/2 (h2c prior knowledge) for lameduck and HAProxy.
- soak (--soak MINUTES): saturation load (wrk) rotated over the proxies in slices for MINUTES,
  RSS and open descriptors of each sampled every few seconds; first/last/max and a verdict.

Run with ``make bench-resources`` (or ``bench/resources.py --help``). Everything listens on
127.0.0.1 and every process it starts is stopped by pid before it returns. The soft
RLIMIT_NOFILE is raised to the hard limit first (the proxies inherit it): N client sockets
here, N downstream descriptors in each proxy.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import resource
import socket
import statistics
import struct
import sys
import tempfile
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import (  # bench/run.py is a script, not a package: found via sys.path
    BenchError,
    Proc,
    Procs,
    _tree,
    run_wrk,
    start_haproxy,
    start_lameduck,
    start_nginx,
    start_origin,
)

PROXIES = ("lameduck", "haproxy", "nginx")
BIG = 100 * 1024 * 1024
GET = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


# --------------------------------------------------------------------------------------------
# What a process tree holds.
# --------------------------------------------------------------------------------------------

def rss_kib(root: int) -> int:
    """VmRSS of ``root`` and its descendants, KiB."""
    total = 0
    for pid in _tree(root):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def fd_count(root: int) -> int:
    """Open descriptors of ``root`` and its descendants."""
    total = 0
    for pid in _tree(root):
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{pid}/fd"))
    return total


def raise_nofile() -> int:
    """Soft RLIMIT_NOFILE up to the hard one (children inherit it); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --------------------------------------------------------------------------------------------
# Idle keep-alive connections.
# --------------------------------------------------------------------------------------------

def _one_get(port: int, deadline: float) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=max(0.1, deadline - time.monotonic()))
    s.sendall(GET)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            s.close()
            raise BenchError(f"127.0.0.1:{port} closed a connection before its response")
        head += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        s.close()
        raise BenchError(f"127.0.0.1:{port}: {head[:40]!r}")
    return s


def idle_rss(proxy: Proc, port: int, n: int, timeout: float = 120.0) -> tuple[int, int]:
    """Open ``n`` keep-alive connections that each did one GET: the proxy's RSS (KiB) before
    the first and 1 s after the last, all ``n`` still open."""
    for _ in range(20):  # warm: the first requests allocate what every later one reuses
        _one_get(port, time.monotonic() + 5).close()
    time.sleep(0.5)
    before = rss_kib(proxy.pid)
    socks: list[socket.socket] = []
    deadline = time.monotonic() + timeout
    try:
        for _ in range(n):  # bounded: n connects within ``timeout``
            if time.monotonic() > deadline:
                raise BenchError(f"{proxy.name}: {len(socks)} of {n} connections in {timeout:g}s")
            socks.append(_one_get(port, deadline))
        time.sleep(1.0)
        after = rss_kib(proxy.pid)
    finally:
        for s in socks:
            s.close()
    return before, after


# --------------------------------------------------------------------------------------------
# A client that reads nothing of a 100 MB response.
# --------------------------------------------------------------------------------------------

def _h1_request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def _hpack_literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    head = struct.pack(">I", len(payload))[1:] + bytes([kind, flags])
    return head + struct.pack(">I", stream) + payload


def _h2_request(path: str) -> bytes:
    """h2c prior knowledge: preface, empty SETTINGS (the default 65,535-byte windows), and one
    GET on stream 1 (HEADERS with END_STREAM | END_HEADERS)."""
    block = b"".join(_hpack_literal(n, v) for n, v in (
        (b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"127.0.0.1"),
        (b":path", path.encode())))
    return (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b"")
            + _frame(1, 0x5, 1, block))


def slow_reader_peak_kib(proxy: Proc, port: int, h2: bool, seconds: float) -> tuple[int, int]:
    """(peak RSS growth KiB, bytes the client's kernel queued) while a client that reads
    nothing holds a 100 MB response open for ``seconds``."""
    before = rss_kib(proxy.pid)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.settimeout(5)
    peak = 0
    try:
        s.connect(("127.0.0.1", port))
        s.sendall((_h2_request if h2 else _h1_request)(f"/bytes?n={BIG}"))
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # bounded in time; reads nothing
            peak = max(peak, rss_kib(proxy.pid) - before)
            time.sleep(0.1)
        queued = struct.unpack("i", fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    finally:
        s.close()
    return peak, queued


# --------------------------------------------------------------------------------------------
# Soak.
# --------------------------------------------------------------------------------------------

def soak(procs: Procs, proxies: dict[str, tuple[Proc, int]], minutes: float, load_cpu: int,
         slice_s: float, every: float, conns: int) -> dict[str, list[tuple[int, int]]]:
    """wrk slices rotated over the proxies for ``minutes`` (one proxy loaded at a time, so
    none competes with another for the CPU); (RSS KiB, fds) of the loaded proxy sampled each
    ``every`` seconds, between pieces of its slice (no sampler competing with wrk)."""
    samples: dict[str, list[tuple[int, int]]] = {n: [] for n in proxies}
    end = time.monotonic() + minutes * 60
    names = list(proxies)
    i = 0
    while time.monotonic() < end:  # bounded in time
        name = names[i % len(names)]
        i += 1
        proxy, port = proxies[name]
        left = end - time.monotonic()
        piece = max(1, round(every))  # wrk takes whole seconds
        pieces = max(1, round(min(slice_s, left) / piece))
        for _ in range(pieces):
            run_wrk(procs, load_cpu, port, piece, conns, 1)
            for n, (p, _) in proxies.items():
                if not p.alive():
                    raise BenchError(f"{n} exited during the soak:\n{p.tail()}")
            # Only the proxy just loaded: its samples all follow load (pools full), so the
            # first and the last compare like with like.
            samples[name].append((rss_kib(proxy.pid), fd_count(proxy.pid)))
    return samples


def verdict(series: list[int], slack_kib: int) -> str:
    """'flat' unless the last third's median sits above the first third's by ``slack_kib``."""
    k = max(1, len(series) // 3)
    grew = statistics.median(series[-k:]) - statistics.median(series[:k])
    return f"flat ({grew:+.0f})" if grew <= slack_kib else f"GROWS ({grew:+.0f})"


# --------------------------------------------------------------------------------------------

def md(rows: list[list[str]], headers: list[str]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def spread(xs: list[float], fmt: Callable[[float], str]) -> str:
    if not xs:
        return "n/a"
    med = statistics.median(xs)
    return fmt(med) if len(xs) == 1 else f"{fmt(med)} ({fmt(min(xs))}-{fmt(max(xs))})"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conns", type=int, default=3000,
                   help="idle keep-alive connections per proxy (3000: under the 4096 maxconn "
                        "and worker_connections of bench/run.py's HAProxy and nginx configs)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    p.add_argument("--slow-seconds", type=float, default=6.0,
                   help="how long the non-reading client holds the 100 MB response (6)")
    p.add_argument("--soak", type=float, default=0.0, metavar="MINUTES",
                   help="also soak for MINUTES (0: no soak; 10 for a release)")
    p.add_argument("--soak-conns", type=int, default=50, help="wrk connections in the soak")
    p.add_argument("--sample-every", type=float, default=5.0, help="soak sampling period (5 s)")
    p.add_argument("--proxy-cpu", type=int, default=0)
    p.add_argument("--load-cpu", type=int, default=1)
    p.add_argument("--skip", default="", help="comma-separated parts to skip: idle,slow")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nofile = raise_nofile()
    if nofile < args.conns + 200:
        raise SystemExit(f"ulimit -n hard limit {nofile} is too low for --conns {args.conns}")
    skip = set(filter(None, args.skip.split(",")))
    print(f"RLIMIT_NOFILE {nofile}; {args.conns} idle connections, {args.rounds} rounds",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="lameduck-res-") as tmp:
        procs = Procs(Path(tmp))
        try:
            _, oport = start_origin(procs, args.load_cpu)
            n_start = 0

            def fresh(name: str) -> tuple[Proc, int]:
                """A proxy just started: memory a previous measurement freed stays in its
                allocator's free lists, and the next one would reuse it unseen."""
                nonlocal n_start
                n_start += 1
                wd = Path(tmp) / f"{name}-{n_start}"
                wd.mkdir()
                if name == "lameduck":
                    return start_lameduck(procs, args.proxy_cpu, wd, oport, h2=True)
                if name == "haproxy":
                    return start_haproxy(procs, args.proxy_cpu, wd, oport, h2=True)
                return start_nginx(procs, args.proxy_cpu, wd, oport)

            def measured(name: str, measure: Callable[[Proc, int], Any]) -> Any:
                """``measure`` on a fresh proxy ``name`` (and its port), stopped after."""
                proxy, port = fresh(name)
                try:
                    return measure(proxy, port)
                finally:
                    procs.stop(proxy)

            def slow_reader(h2: bool) -> Callable[[Proc, int], tuple[int, int]]:
                def measure(proxy: Proc, port: int) -> tuple[int, int]:
                    _one_get(port, time.monotonic() + 5).close()  # warm (HTTP/1.1)
                    return slow_reader_peak_kib(proxy, proxy.h2_port if h2 else port, h2,
                                                args.slow_seconds)
                return measure

            idle: dict[str, list[float]] = {n: [] for n in PROXIES}
            slow1: dict[str, list[float]] = {n: [] for n in PROXIES}
            slow2: dict[str, list[float]] = {n: [] for n in PROXIES}
            for r in range(args.rounds):
                for name in PROXIES[r % 3:] + PROXIES[:r % 3]:
                    if "idle" not in skip:
                        before, after = measured(name, lambda proxy, port: idle_rss(
                            proxy, port, args.conns))
                        idle[name].append((after - before) / args.conns)
                        print(f"round {r + 1} {name}: RSS {before / 1024:.1f} MiB, "
                              f"{after / 1024:.1f} MiB with {args.conns} idle keep-alive "
                              f"connections open: {idle[name][-1]:.2f} KiB per connection",
                              flush=True)
                    if "slow" in skip:
                        continue
                    peak, q = measured(name, slow_reader(False))
                    slow1[name].append(peak)
                    msg = f"round {r + 1} {name}: h1 slow reader +{peak} KiB (client queued {q})"
                    if name != "nginx":  # bench/run.py's nginx has no h2c listener
                        peak, q = measured(name, slow_reader(True))
                        slow2[name].append(peak)
                        msg += f", h2 +{peak} KiB (client queued {q})"
                    print(msg, flush=True)
            rows = [[n, spread(idle[n], lambda v: f"{v:.2f}"),
                     spread(slow1[n], lambda v: f"{v:.0f}"),
                     spread(slow2[n], lambda v: f"{v:.0f}")] for n in PROXIES]
            print()
            print(md(rows, ["proxy", f"KiB per idle keep-alive conn ({args.conns})",
                            "slow reader, HTTP/1.1: peak RSS growth KiB (100 MB body)",
                            "slow reader, HTTP/2: peak RSS growth KiB"]))
            print(f"\nmedian (min-max) over {args.rounds} interleaved rounds. Idle: VmRSS "
                  f"growth of the proxy's processes with {args.conns} connections open that "
                  "each did one keep-alive GET (measured 1 s after the last), over their "
                  "number; each proxy freshly started.", flush=True)
            if args.soak > 0:
                proxies = {n: fresh(n) for n in PROXIES}
                samples = soak(procs, proxies, args.soak, args.load_cpu, 10.0,
                               args.sample_every, args.soak_conns)
                srows = []
                for n in PROXIES:
                    rss = [a for a, _ in samples[n]]
                    fds = [b for _, b in samples[n]]
                    # fds: the upstream keep-alive pools refill up to the load's concurrency
                    # after each wrk piece, so only growth past that is a leak.
                    srows.append([n, str(len(rss)), f"{rss[0] / 1024:.1f}",
                                  f"{rss[-1] / 1024:.1f}", f"{max(rss) / 1024:.1f}",
                                  verdict(rss, 2048) + " KiB",
                                  f"{fds[0]}/{fds[-1]}/{min(fds)}/{max(fds)}",
                                  verdict(fds, args.soak_conns)])
                print()
                print(md(srows, ["proxy", "samples", "RSS first MiB", "last", "max",
                                 "RSS verdict", "fds first/last/min/max", "fd verdict"]))
                print(f"\nsoak: {args.soak:g} min of wrk -c{args.soak_conns}, 10 s slices "
                      "rotated over the proxies, sampled every "
                      f"{args.sample_every:g} s", flush=True)
        finally:
            procs.stop_all()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        sys.exit(1)
