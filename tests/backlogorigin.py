"""An origin with Python's stdlib accept queue: ``http.server.ThreadingHTTPServer``, whose
``socketserver`` listens with ``request_queue_size = 5``. A burst of connects beyond that the
kernel drops (a SYN dropped, or the handshake's last ACK ignored: ``tcp_abort_on_overflow``
off) until the accept loop catches up, the way many small Python origins behave.

Run as ``python tests/backlogorigin.py [DELAY_MS]``: keep-alive HTTP/1.1, every request answers
``200`` with a short body after ``DELAY_MS`` (default 3); prints ``listening on 127.0.0.1:P``
once it accepts.
"""

from __future__ import annotations

import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = b"hello from a backlog-5 origin\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the proxy pools its connections
    delay = 0.003

    def do_GET(self) -> None:
        time.sleep(self.delay)
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
    Handler.delay = (int(sys.argv[1]) if len(sys.argv) > 1 else 3) / 1000
    server = Server(("127.0.0.1", 0), Handler)
    print(f"listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever(poll_interval=0.5)


if __name__ == "__main__":
    main()
