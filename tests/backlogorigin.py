"""An origin with Python's stdlib accept queue: ``http.server.ThreadingHTTPServer``, whose
``socketserver`` listens with ``request_queue_size = 5``. A burst of connects beyond that the
kernel drops (a SYN dropped, or the handshake's last ACK ignored: ``tcp_abort_on_overflow``
off) until the accept loop catches up, the way many small Python origins behave.

Run as ``python tests/backlogorigin.py [WAIT_MS [CPU_MS]]``: keep-alive HTTP/1.1, every request
answers ``200`` with a short body after ``CPU_MS`` (default 1) of pure-Python work, which holds
the GIL the accept loop needs too, as a handler rendering a page does, and ``WAIT_MS`` (default
2) of waiting, as on a database; prints ``listening on 127.0.0.1:P`` once it accepts.
"""

from __future__ import annotations

import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = b"hello from a backlog-5 origin\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the proxy pools its connections
    wait = 0.002
    cpu = 0.001

    def do_GET(self) -> None:
        end = time.perf_counter() + self.cpu
        while time.perf_counter() < end:
            pass
        time.sleep(self.wait)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: one line per request would cost more than the request."""


class Server(ThreadingHTTPServer):
    request_queue_size = 5  # socketserver's default, spelled out: the point of this origin
    daemon_threads = True


def main() -> None:
    if len(sys.argv) > 1:
        Handler.wait = int(sys.argv[1]) / 1000
    if len(sys.argv) > 2:
        Handler.cpu = int(sys.argv[2]) / 1000
    server = Server(("127.0.0.1", 0), Handler)
    print(f"listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever(poll_interval=0.5)


if __name__ == "__main__":
    main()
