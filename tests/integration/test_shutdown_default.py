"""With the defaults, a SIGTERMed lameduck keeps accepting and serving until T.

Clients keep arriving after SIGTERM until the endpoint removal reaches them. lameduck once
exited the first instant it held no request and no connection (0.4 to 3.3 s into an 8 s drain)
and closed its listener under those clients: ECONNREFUSED, while its drain report read
``refused=0 cut=0``. A client with no other address to go to shows it plainly.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.procs import Lameduck, base_config

pytestmark = pytest.mark.usefixtures("workers")

T = 3.0


def _one_request(port: int) -> str:
    """A new connection, one request, the whole response: ``ok`` or what went wrong."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except ConnectionRefusedError:
        return "refused"
    except ConnectionResetError:
        return "reset"
    except OSError as e:
        return f"error {e}"
    if not data.startswith(b"HTTP/1.1 200 "):
        return f"status {data[:12]!r}"
    return "ok"


def test_sigterm_under_new_connection_load_refuses_nobody_before_t(
    origin_port: int, lameduck: Callable[..., Lameduck],
) -> None:
    cfg: dict[str, Any] = base_config(origin_port, drain={"time": f"{T}s"},
                                      shutdown={"deadline": "6s"})
    del cfg["shutdown"]["min_drain"]  # the default
    ld = lameduck(cfg)
    outcomes: list[tuple[float, str]] = []
    lock = threading.Lock()
    sigterm_at: list[float] = []
    stop_at = time.monotonic() + 60  # replaced once the SIGTERM time is known

    def client() -> None:
        for _ in range(20_000):  # bounded in count as well as in time
            now = time.monotonic()
            if now >= stop_at:
                return
            result = _one_request(ld.port)
            with lock:
                outcomes.append((now, result))

    threads = [threading.Thread(target=client) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # load before the signal
    sigterm_at.append(time.monotonic())
    stop_at = sigterm_at[0] + T - 0.5  # the removal has reached every client by then
    ld.signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=T + 10)
    assert ld.proc is not None and ld.proc.poll() is None, "exited before T"
    code = ld.wait(timeout=10)
    exited = time.monotonic() - sigterm_at[0]
    after = [r for at, r in outcomes if at >= sigterm_at[0]]
    failed = [r for r in after if r != "ok"]
    assert len(after) > 20, f"too little load after SIGTERM: {len(after)}"
    assert failed == [], f"{len(failed)} of {len(after)} failed after SIGTERM: {failed[:5]}"
    assert code == 0
    assert exited >= T - 0.2, f"exited {exited:.2f}s after SIGTERM, before T={T}s"
    assert "reset in the accept queue at listener close=0" in ld.log()
