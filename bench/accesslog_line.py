#!/usr/bin/env python3
"""What one access-log line costs, alone: Envoy's default format on an exchange as the
HTTP/1.1 codec leaves it at settle (the bench's keep-alive GET and a browser-like request), by
the default's own formatter, by the same format compiled operator by operator, and through
``AccessLog.record`` into the file buffer. Compile first (``make fast``) to measure what runs.

    PYTHONPATH=src .venv/bin/python bench/accesslog_line.py
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
import timeit
from pathlib import Path
from types import SimpleNamespace

import lameduck.proxy.accesslog as al
from lameduck.drain import ProcessDrain
from lameduck.proxy.downstream import Downstream
from lameduck.proxy.exchange import Exchange
from lameduck.stats import HttpStats
from lameduck.upstream.pool import Endpoint

NUMBER = 100_000


def exchange(agent: bytes | None, xff: bytes, loop: asyncio.AbstractEventLoop) -> Exchange:
    # a real Downstream: the compiled Exchange takes no other
    down = Downstream(SimpleNamespace(loop=loop, stats=HttpStats(), process=ProcessDrain(),
                                      suppress_envoy_headers=False, alt_svc=None))
    ex = Exchange(down, b"GET")
    ex.t0 = 1000.0
    ex.status = 200
    ex.bytes_tx = 36
    ex.request_id = b"6c538f7dee76604c2ead95ce1aa02e72"
    ex.endpoint = Endpoint("127.0.0.1", 37151, 4)
    lines = [b"host: 127.0.0.1:57197\r\n", b"x-request-id: %s\r\n" % ex.request_id]
    if agent is not None:
        lines.insert(1, b"User-Agent: %s\r\n" % agent)
        lines.insert(2, b"Accept: text/html,application/xhtml+xml\r\n")
        lines.insert(3, b"Accept-Language: en-US,en;q=0.5\r\n")
    lines.append(b"x-forwarded-for: %s\r\nx-forwarded-proto: http\r\n\r\n" % xff)
    ex.log_req = (b"/", [(b"host", b"127.0.0.1:57197")], lines)
    ex.log_host = b"127.0.0.1:57197"
    ex.log_xff = xff
    ex.log_agent = agent
    ex.resp_fields = [(b"Content-Length", b"36"), (b"Content-Type", b"text/plain")]
    return ex


def main() -> None:
    loop = asyncio.new_event_loop()
    cases = {
        "wrk GET (Host only)": exchange(None, b"127.0.0.1", loop),
        "browser-like GET": exchange(b"Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Firefox/128.0",
                                     b"203.0.113.7, 127.0.0.1", loop),
    }
    text = al.compile_text(al.DEFAULT_FORMAT)
    with tempfile.TemporaryDirectory() as tmp:
        log = al.open_access_log(str(Path(tmp) / "access.log"), None, loop)
        print(f"accesslog: {al.__file__.rsplit('/', 1)[-1]}")
        for name, ex in cases.items():
            now = 1000.002
            wall = 1_700_000_000.0
            assert al.default_line(ex, now, wall) == text(ex, now, wall).encode()
            for label, fn in (
                ("default_line", functools.partial(al.default_line, ex, now, wall)),
                ("compile_text(DEFAULT_FORMAT)", functools.partial(text, ex, now, wall)),
                ("AccessLog.record", functools.partial(log.record, ex, now)),
            ):
                best = min(timeit.repeat(fn, number=NUMBER, repeat=5))
                print(f"{name:22} {label:30} {best / NUMBER * 1e6:6.2f} µs")
        log.file.close()
    loop.close()


if __name__ == "__main__":
    main()
