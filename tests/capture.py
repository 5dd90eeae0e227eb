"""A raw-socket origin that records every byte it receives and answers with scripted bytes.

The demo origin parses like a real server; this one shows a test exactly what went over the
wire to the upstream (a header lameduck dropped, a body read as the start of another request).
It frames requests the way an origin would (RFC 9112 §6.3: Transfer-Encoding chunked, else
Content-Length, else no body), so a request smuggled in a body shows up as a request of its own.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

Responder = Callable[[bytes], bytes]


def echo_request_line(head: bytes) -> bytes:
    """The default answer: the request line as the body, so a client sees which request a
    response belongs to."""
    body = head.split(b"\r\n", 1)[0] + b"\n"
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


class CaptureOrigin:
    """Accepts on 127.0.0.1 (port 0, read back), one thread per connection."""

    def __init__(self, respond: Responder = echo_request_line) -> None:
        self.respond = respond
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.received: list[bytearray] = []  # every connection's bytes, in accept order
        self.requests: list[bytes] = []  # each request as framed here: head + body
        self.last_rx = 0.0  # time.monotonic() of the last bytes received
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def all_bytes(self) -> bytes:
        with self.lock:
            return b"".join(bytes(b) for b in self.received)

    def quiet(self, period: float = 0.03, timeout: float = 3.0) -> bool:
        """Wait until no byte has arrived for ``period`` (bounded by ``timeout``): bytes a
        dropped upstream connection still carried reach this thread late on a loaded
        machine, and must not be counted for the case that follows."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                idle = time.monotonic() - self.last_rx
            if idle >= period:
                return True
            time.sleep(period - idle)
        return False

    def mark(self) -> list[int]:
        """How much each connection has received so far (for ``since``)."""
        with self.lock:
            return [len(b) for b in self.received]

    def since(self, mark: list[int]) -> bytes:
        """The bytes received after ``mark``, connection by connection: a pooled connection
        that goes on receiving would shift a slice of ``all_bytes``."""
        with self.lock:
            return b"".join(bytes(b[mark[i]:] if i < len(mark) else b)
                            for i, b in enumerate(self.received))

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                buf = bytearray()
                self.received.append(buf)
            threading.Thread(target=self._serve, args=(conn, buf), daemon=True).start()

    def _serve(self, conn: socket.socket, record: bytearray) -> None:
        pending = b""
        conn.settimeout(10)
        try:
            while True:
                request, pending = self._read_request(conn, pending, record)
                if request is None:
                    return
                with self.lock:
                    self.requests.append(request)
                conn.sendall(self.respond(request))
        except OSError:
            return
        finally:
            conn.close()

    def _more(self, conn: socket.socket, record: bytearray) -> bytes:
        data = conn.recv(65536)
        with self.lock:
            record += data
            self.last_rx = time.monotonic()
        return data

    def _read_request(self, conn: socket.socket, buf: bytes,
                      record: bytearray) -> tuple[bytes | None, bytes]:
        while b"\r\n\r\n" not in buf:
            data = self._more(conn, record)
            if not data:
                return None, b""
            buf += data
        head, rest = buf.split(b"\r\n\r\n", 1)
        head += b"\r\n\r\n"
        fields = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip()
        if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            body_end = self._chunked_end(rest)
            while body_end < 0:
                data = self._more(conn, record)
                if not data:
                    return None, b""
                rest += data
                body_end = self._chunked_end(rest)
            return head + rest[:body_end], rest[body_end:]
        length = int(fields.get(b"content-length", b"0") or 0)
        while len(rest) < length:
            data = self._more(conn, record)
            if not data:
                return None, b""
            rest += data
        return head + rest[:length], rest[length:]

    @staticmethod
    def _chunked_end(data: bytes) -> int:
        """Where a chunked body (its trailer section included) ends in ``data``; -1 if not
        all here (RFC 9112 §7.1)."""
        at = 0
        while True:
            line_end = data.find(b"\r\n", at)
            if line_end < 0:
                return -1
            size = int(data[at:line_end].split(b";")[0], 16)
            at = line_end + 2
            if size == 0:
                trailers_end = data.find(b"\r\n\r\n", at - 2)
                return -1 if trailers_end < 0 else trailers_end + 4
            at += size + 2
            if at > len(data):
                return -1

    def close(self) -> None:
        self.sock.close()
