"""An asyncio HTTP/2 client pool for drain tests, built on hyperframe + hpack, that handles a
graceful GOAWAY the way RFC 9113 §6.8 says: no new streams on that connection, streams at or
below the last-stream-id finish, streams above it (and REFUSED_STREAM) are retried on a new
connection, because the server never processed them.

Why not httpx: httpcore fails every in-flight request on a connection once a GOAWAY arrives,
even GOAWAY(2^31-1, NO_ERROR) (encode/httpcore#730, #1054; the h2 state machine closes on a
received GOAWAY, python-hyper/h2#1181), so it cannot show a drain with zero failed requests.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import hpack
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
REFUSED_STREAM = 7
WINDOW = 2**31 - 1


class Retry(Exception):
    """The server did not process the request: safe to send it again elsewhere."""


@dataclass
class _Stream:
    done: asyncio.Future[tuple[int, bytes]]
    status: int = 0
    body: bytearray = field(default_factory=bytearray)


class H2Conn:
    def __init__(self, pool: H2Pool) -> None:
        self.pool = pool
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.streams: dict[int, _Stream] = {}
        self.next_id = 1
        self.goaway: int | None = None  # last-stream-id of the newest GOAWAY
        self.closed = False
        self.reader: asyncio.StreamReader
        self.writer: asyncio.StreamWriter
        self.task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.pool.port)
        self.writer.write(
            PREFACE + SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: WINDOW})
            .serialize() + WindowUpdateFrame(0, window_increment=WINDOW - 65535).serialize())
        self.task = asyncio.get_running_loop().create_task(self._read())

    @property
    def usable(self) -> bool:
        return not self.closed and self.goaway is None

    async def get(self, path: str) -> tuple[int, bytes]:
        sid = self.next_id
        self.next_id += 2
        fut: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self.streams[sid] = _Stream(fut)
        hf = HeadersFrame(sid, self.enc.encode([
            (":method", "GET"), (":scheme", "http"),
            (":authority", f"127.0.0.1:{self.pool.port}"), (":path", path)]))
        hf.flags.add("END_HEADERS")
        hf.flags.add("END_STREAM")
        self.writer.write(hf.serialize())
        return await fut

    async def _read(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(9)
                f, length = Frame.parse_frame_header(memoryview(head))
                f.parse_body(memoryview(await self.reader.readexactly(length)))
                self._frame(f)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed = True
            for sid, s in list(self.streams.items()):
                if not s.done.done():
                    # Never answered: unprocessed (above the GOAWAY id) is a retry, else lost.
                    if self.goaway is not None and sid > self.goaway:
                        s.done.set_exception(Retry(f"stream {sid} above GOAWAY"))
                    else:
                        s.done.set_exception(ConnectionError(f"stream {sid} lost at close"))
            self.writer.close()

    def _frame(self, f: Frame) -> None:
        w = self.writer
        if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
            w.write(SettingsFrame(0, flags=["ACK"]).serialize())
        elif isinstance(f, PingFrame) and "ACK" not in f.flags:
            w.write(PingFrame(0, f.opaque_data, flags=["ACK"]).serialize())
        elif isinstance(f, GoAwayFrame):
            self.goaway = f.last_stream_id
            self.pool.goaways += 1
            for sid, s in list(self.streams.items()):
                if sid > f.last_stream_id and not s.done.done():
                    s.done.set_exception(Retry(f"stream {sid} above GOAWAY"))
        elif isinstance(f, HeadersFrame):
            s = self.streams.get(f.stream_id)
            fields = self.dec.decode(f.data)  # always: the HPACK state must stay in step
            if s is not None:
                for name, value in fields:
                    if name == ":status":
                        s.status = int(value)
                if "END_STREAM" in f.flags:
                    self._end(f.stream_id)
        elif isinstance(f, DataFrame):
            s = self.streams.get(f.stream_id)
            if f.flow_controlled_length:
                w.write(WindowUpdateFrame(0, window_increment=f.flow_controlled_length)
                        .serialize())
            if s is not None:
                s.body += f.data
                if "END_STREAM" in f.flags:
                    self._end(f.stream_id)
        elif isinstance(f, RstStreamFrame):
            s = self.streams.pop(f.stream_id, None)
            if s is not None and not s.done.done():
                if f.error_code == REFUSED_STREAM:
                    s.done.set_exception(Retry(f"stream {f.stream_id} refused"))
                else:
                    s.done.set_exception(ConnectionError(
                        f"stream {f.stream_id} reset with {f.error_code}"))

    def _end(self, sid: int) -> None:
        s = self.streams.pop(sid)
        if not s.done.done():
            s.done.set_result((s.status, bytes(s.body)))
        if self.goaway is not None and not self.streams:
            self.writer.close()  # drained and idle: let go of it


class H2Pool:
    """Requests multiplexed on one connection at a time; a new one once it is told to go away."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: H2Conn | None = None
        self.connections = 0
        self.goaways = 0
        self.retries = 0
        self._opening: asyncio.Future[H2Conn] | None = None

    async def _usable(self) -> H2Conn:
        if self.conn is not None and self.conn.usable:
            return self.conn
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_future()
            conn = H2Conn(self)
            try:
                await conn.open()
            except BaseException as e:
                self._opening.set_exception(e)
                self._opening = None
                raise
            self.connections += 1
            self.conn = conn
            self._opening.set_result(conn)
            self._opening = None
            return conn
        return await asyncio.shield(self._opening)

    async def get(self, path: str, attempts: int = 3) -> tuple[int, bytes]:
        for i in range(attempts):
            conn = await self._usable()
            try:
                return await conn.get(path)
            except Retry:
                self.retries += 1
                if i == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self.conn is not None and not self.conn.closed:
            self.conn.writer.close()
