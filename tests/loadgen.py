"""A small HTTP/1.1 load client that counts every failure, for the hot-restart tests.

Keep-alive workers reuse one connection until the server says ``Connection: close`` (a drain)
or closes it; new-connection workers open one per request. A request is retried once, and
counted as ``stale_retries``, only when it went out on a reused keep-alive connection and the
connection ended before any response byte: the race RFC 9112 §9.3.1 lets a client retry (the
server closed an idle connection as the request was sent). Everything else that is not a 200
is a failure: ``refused`` (connect refused), ``errors`` (reset, EOF, timeout), ``bad_status``.
Bounded in time and count; only 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Counts:
    ok: int = 0
    refused: int = 0
    errors: int = 0
    bad_status: int = 0
    stale_retries: int = 0
    connections: int = 0
    samples: list[str] = field(default_factory=list)  # the first failures, for the message
    failed_at: list[float] = field(default_factory=list)  # when each failure came (monotonic)

    @property
    def failed(self) -> int:
        return self.refused + self.errors + self.bad_status

    def fail(self, kind: str, detail: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.failed_at.append(time.monotonic())
        if len(self.samples) < 10:
            self.samples.append(f"{kind}: {detail}")


class _Stale(Exception):
    """The reused connection ended before any response byte."""


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes, reused: bool) -> tuple[int, bool]:
    """One request; (status, server wants close)."""
    writer.write(request)
    await writer.drain()
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if reused and not e.partial:
            raise _Stale from e
        raise
    except ConnectionResetError:
        if reused:
            raise _Stale from None
        raise
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    close = False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "connection" and "close" in value.lower():
            close = True
    if length:
        await reader.readexactly(length)
    return status, close


def _going(until: float, stop: threading.Event | None) -> bool:
    return time.monotonic() < until and not (stop is not None and stop.is_set())


async def _keepalive(port: int, until: float, limit: int, counts: Counts,
                     stop: threading.Event | None, path: str) -> None:
    request = b"GET %s HTTP/1.1\r\nHost: lameduck\r\n\r\n" % path.encode()
    writer: asyncio.StreamWriter | None = None
    reader: asyncio.StreamReader | None = None
    reused = False
    n = 0
    while _going(until, stop) and n < limit:
        n += 1
        for attempt in (0, 1):
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    counts.connections += 1
                    reused = False
                assert reader is not None
                status, close = await asyncio.wait_for(
                    _exchange(reader, writer, request, reused), 10)
            except _Stale:
                writer.close()  # type: ignore[union-attr]
                writer = None
                if attempt == 0:
                    counts.stale_retries += 1
                    continue
                counts.fail("errors", "stale twice")
                break
            except ConnectionRefusedError as e:
                counts.fail("refused", repr(e))
                writer = None
                await asyncio.sleep(0.01)
                break
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as e:
                counts.fail("errors", repr(e))
                if writer is not None:
                    writer.close()
                writer = None
                break
            if status == 200:
                counts.ok += 1
            else:
                counts.fail("bad_status", str(status))
            reused = True
            if close:
                writer.close()
                writer = None
            break
    if writer is not None:
        writer.close()


async def _new_connections(port: int, until: float, limit: int, counts: Counts,
                           stop: threading.Event | None, pause: float) -> None:
    request = b"GET / HTTP/1.1\r\nHost: lameduck\r\nConnection: close\r\n\r\n"
    n = 0
    while _going(until, stop) and n < limit:
        n += 1
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except ConnectionRefusedError as e:
            counts.fail("refused", repr(e))
            await asyncio.sleep(0.01)
            continue
        except OSError as e:
            counts.fail("errors", repr(e))
            continue
        counts.connections += 1
        try:
            status, _ = await asyncio.wait_for(_exchange(reader, writer, request, False), 10)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as e:
            counts.fail("errors", repr(e))
        else:
            if status == 200:
                counts.ok += 1
            else:
                counts.fail("bad_status", str(status))
        finally:
            writer.close()
        if pause:
            await asyncio.sleep(pause)


async def run(port: int, seconds: float, keepalive: int = 8, fresh: int = 4,
              limit: int = 200_000, stop: threading.Event | None = None,
              counts: Counts | None = None, path: str = "/", pause: float = 0.0) -> Counts:
    """Load ``127.0.0.1:port`` for ``seconds`` or until ``stop`` is set (each worker at most
    ``limit`` requests). ``counts``: added into as it goes, so another thread can watch the
    load progress (a test waiting for N more answers). ``path``: what the keep-alive workers
    ask for (``/sleep?ms=500``: always a request in flight); ``pause``: seconds each
    new-connection worker waits between its connections."""
    counts = Counts() if counts is None else counts
    until = time.monotonic() + seconds
    await asyncio.gather(
        *(_keepalive(port, until, limit, counts, stop, path) for _ in range(keepalive)),
        *(_new_connections(port, until, limit, counts, stop, pause) for _ in range(fresh)),
    )
    return counts
