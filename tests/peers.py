"""Peers for tunnel tests that are not HTTP servers: a CONNECT destination in a thread."""

from __future__ import annotations

import hashlib
import socket
import threading


class Destination:
    """A TCP destination for CONNECT tests: reads until the client's FIN, then answers with
    how many bytes it got and their sha256, then closes. One connection at a time."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.stop = False
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(10)
            data = b""
            try:
                while chunk := conn.recv(65536):
                    data += chunk
                self.received.append(data)
                conn.sendall(b"got %d %s" % (len(data), hashlib.sha256(data).hexdigest().encode()))
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self.stop = True
        self.sock.close()


def answer(data: bytes) -> bytes:
    return b"got %d %s" % (len(data), hashlib.sha256(data).hexdigest().encode())
