"""Peers for tunnel tests that are not HTTP servers: a CONNECT destination in a thread, and
the threaded server it and other test destinations are made from."""

from __future__ import annotations

import hashlib
import socket
import threading


class ThreadedServer:
    """A loopback TCP server on a port of its own (bound to 0, read back), its accept loop in a
    daemon thread: ``serve`` answers each connection, one at a time."""

    def __init__(self, backlog: int = 8) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(backlog)
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.serve(conn)

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stop = True
        self.sock.close()


class Destination(ThreadedServer):
    """A TCP destination for CONNECT tests: reads until the client's FIN, then answers with
    how many bytes it got and their sha256, then closes. One connection at a time."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        data = b""
        try:
            while chunk := conn.recv(65536):
                data += chunk
            self.received.append(data)
            conn.sendall(answer(data))
        except OSError:
            pass
        finally:
            conn.close()


def answer(data: bytes) -> bytes:
    return b"got %d %s" % (len(data), hashlib.sha256(data).hexdigest().encode())
