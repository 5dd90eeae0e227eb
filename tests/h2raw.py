"""A raw-frame HTTP/2 client for tests: it sends exactly the frames a test asks for and reports
every frame it receives, so GOAWAY sequences and stream refusals can be checked on the wire.

(The ``h2`` library's client stops at the first GOAWAY it receives — python-hyper/h2#1181 —
so it cannot show what a draining server sends after it.)
"""

from __future__ import annotations

import contextlib
import socket
import time
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


@dataclass
class StreamResult:
    status: int | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: int | None = None  # RST_STREAM error code


class RawH2:
    """One HTTP/2 connection over a blocking socket, frames in and out by hand."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 5.0,
                 window: int = 1 << 30) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.buf = bytearray()
        self.streams: dict[int, StreamResult] = {}
        self.goaways: list[tuple[int, int]] = []  # (last_stream_id, error_code) in order
        self.frames: list[Frame] = []
        self.eof = False
        self.authority = f"{host}:{port}"
        self.sock.sendall(PREFACE + SettingsFrame(0, settings={
            SettingsFrame.INITIAL_WINDOW_SIZE: min(window, 2**31 - 1)}).serialize()
            + WindowUpdateFrame(0, window_increment=min(window, 2**31 - 1) - 65535).serialize())

    # -- sending ----------------------------------------------------------------------------
    def request(self, sid: int, path: str, method: str = "GET", body: bytes | None = None,
                headers: list[tuple[str, str]] | None = None, end: bool = True) -> None:
        fields = [(":method", method), (":scheme", "http"), (":authority", self.authority),
                  (":path", path), *(headers or [])]
        hf = HeadersFrame(sid, self.enc.encode(fields))
        hf.flags.add("END_HEADERS")
        if not body and end:
            hf.flags.add("END_STREAM")
        out = hf.serialize()
        if body:
            df = DataFrame(sid, body)
            df.flags.add("END_STREAM")
            out += df.serialize()
        self.streams[sid] = StreamResult()
        self.sock.sendall(out)

    def connect(self, sid: int, authority: str) -> None:
        """A CONNECT stream (RFC 9113 §8.5: only :method and :authority)."""
        hf = HeadersFrame(sid, self.enc.encode([(":method", "CONNECT"),
                                                (":authority", authority)]))
        hf.flags.add("END_HEADERS")
        self.streams[sid] = StreamResult()
        self.sock.sendall(hf.serialize())

    def data(self, sid: int, data: bytes, end: bool = False) -> None:
        df = DataFrame(sid, data)
        if end:
            df.flags.add("END_STREAM")
        self.sock.sendall(df.serialize())

    def send_trailers(self, sid: int, fields: list[tuple[str, str]]) -> None:
        """A trailer section: HEADERS with END_STREAM after the body."""
        hf = HeadersFrame(sid, self.enc.encode(fields))
        hf.flags.add("END_HEADERS")
        hf.flags.add("END_STREAM")
        self.sock.sendall(hf.serialize())

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    # -- receiving --------------------------------------------------------------------------
    def _frame(self) -> Frame | None:
        if len(self.buf) < 9:
            return None
        f, length = Frame.parse_frame_header(memoryview(self.buf[:9]))
        if len(self.buf) < 9 + length:
            return None
        f.parse_body(memoryview(bytes(self.buf[9 : 9 + length])))
        del self.buf[: 9 + length]
        return f

    def pump(self, until: float) -> Frame | None:
        """Read and handle one frame, or None at EOF/timeout."""
        while True:
            f = self._frame()
            if f is not None:
                self._handle(f)
                return f
            if self.eof:
                return None
            left = until - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return None
            except ConnectionResetError:
                self.eof = True
                return None
            if not data:
                self.eof = True
                return None
            self.buf += data

    def _reply(self, data: bytes) -> None:
        """What the client answers by itself (SETTINGS and PING ACKs, WINDOW_UPDATE): frames
        read after the server closed are still answered, and a peer gone meanwhile (EPIPE,
        ECONNRESET: a loaded machine reads late) is no error of the test's, as for any client."""
        # (what the server sent before it closed is still read: EOF is the reader's to find)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.sock.sendall(data)

    def _handle(self, f: Frame) -> None:
        self.frames.append(f)
        if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
            self._reply(SettingsFrame(0, flags=["ACK"]).serialize())
        elif isinstance(f, PingFrame) and "ACK" not in f.flags:
            self._reply(PingFrame(0, f.opaque_data, flags=["ACK"]).serialize())
        elif isinstance(f, GoAwayFrame):
            self.goaways.append((f.last_stream_id, f.error_code))
        elif isinstance(f, HeadersFrame):
            s = self.streams.setdefault(f.stream_id, StreamResult())
            fields = self.dec.decode(f.data)
            for name, value in fields:
                if name == ":status":
                    s.status = int(value)
                else:
                    s.headers.append((name, value))
            if "END_STREAM" in f.flags:
                s.ended = True
        elif isinstance(f, DataFrame):
            s = self.streams.setdefault(f.stream_id, StreamResult())
            s.body += f.data
            if f.flow_controlled_length:
                self._reply(
                    WindowUpdateFrame(0, window_increment=f.flow_controlled_length).serialize())
                if "END_STREAM" not in f.flags:
                    self._reply(WindowUpdateFrame(
                        f.stream_id, window_increment=f.flow_controlled_length).serialize())
            if "END_STREAM" in f.flags:
                s.ended = True
        elif isinstance(f, RstStreamFrame):
            self.streams.setdefault(f.stream_id, StreamResult()).reset = f.error_code

    def wait(self, pred, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
        until = time.monotonic() + timeout
        while not pred():
            if self.pump(until) is None and (self.eof or time.monotonic() >= until):
                return bool(pred())
        return True

    def done(self, sid: int) -> bool:
        s = self.streams.get(sid)
        return s is not None and (s.ended or s.reset is not None)

    def close(self) -> None:
        self.sock.close()
