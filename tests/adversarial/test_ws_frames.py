"""WebSocket frame corpus: invalid client frames sent through lameduck's HTTP/1.1 Upgrade
tunnel to a real WebSocket server (tests/wsecho.py). RFC 6455 §5.2 and §5.5 (masking, reserved
bits and opcodes, control frames: at most 125 octets and never fragmented, the most significant
bit of a 64-bit length is 0), §7.4 (close codes): lameduck's frame tracker closes that tunnel
only, with 1002 to the client that sent the frame and 1001 to the upstream (docs/tunnels.md),
and a bystander tunnel opened before the corpus keeps echoing.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

import pytest
from websockets.sync.client import ClientConnection, connect

from tests.adversarial.conftest import run_proxy
from tests.integration.test_websocket import _raw_upgrade, _read_frame
from tests.procs import Lameduck, WsEcho, base_config, stop, wait_until


def masked(first: int, payload: bytes, length: bytes | None = None) -> bytes:
    """A client frame: ``first`` is FIN/RSV/opcode; ``length`` overrides the length field."""
    key = os.urandom(4)
    if length is None:
        n = len(payload)
        length = (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
                  if n < 65536 else bytes([0x80 | 127]) + struct.pack(">Q", n))
    return bytes([first]) + length + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def close(code: int, reason: bytes = b"") -> bytes:
    return masked(0x88, struct.pack(">H", code) + reason)


CORPUS = [
    pytest.param(b"\x81\x02hi", id="unmasked-text"),
    pytest.param(b"\x89\x00", id="unmasked-ping"),
    pytest.param(masked(0x83, b"x"), id="reserved-opcode-3"),
    pytest.param(masked(0x87, b"x"), id="reserved-opcode-7"),
    pytest.param(masked(0x8B, b"x"), id="reserved-control-opcode-b"),
    pytest.param(masked(0xC1, b"x"), id="rsv1-without-extension"),
    pytest.param(masked(0xA1, b"x"), id="rsv2"),
    pytest.param(masked(0x91, b"x"), id="rsv3"),
    pytest.param(masked(0x09, b"x"), id="fragmented-ping"),
    pytest.param(masked(0x08, struct.pack(">H", 1000)), id="fragmented-close"),
    pytest.param(masked(0x89, b"p" * 126), id="ping-126-bytes"),
    pytest.param(masked(0x8A, b"p" * 200), id="pong-200-bytes"),
    pytest.param(masked(0x88, b"c" * 126), id="close-126-bytes"),
    pytest.param(masked(0x82, b"", length=b"\xff" + struct.pack(">Q", 1 << 63)),
                 id="length-2^63"),
    pytest.param(masked(0x82, b"", length=b"\xff" + struct.pack(">Q", 2**64 - 1)),
                 id="length-2^64-1"),
    pytest.param(masked(0x88, b"\x03"), id="close-one-byte"),
    pytest.param(close(999), id="close-code-999"),
    pytest.param(close(1004), id="close-code-1004"),
    pytest.param(close(1005), id="close-code-1005"),
    pytest.param(close(1006), id="close-code-1006"),
    pytest.param(close(1015), id="close-code-1015"),
    pytest.param(close(1016), id="close-code-1016"),
    pytest.param(close(5000), id="close-code-5000"),
]


@pytest.fixture(scope="module")
def wsecho() -> Iterator[WsEcho]:
    server = WsEcho()
    yield server
    stop(server.proc)


@pytest.fixture(scope="module")
def proxy(wsecho: WsEcho, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lameduck]:
    yield from run_proxy(base_config(wsecho.port), tmp_path_factory, "adv-ws")


@pytest.fixture(scope="module")
def bystander(proxy: Lameduck) -> Iterator[ClientConnection]:
    with connect(f"ws://{proxy.addr}/bystander", ping_interval=None) as ws:
        yield ws


def upstream_close(wsecho: WsEcho, before: int) -> str:
    """The close the upstream received for the tunnel that just ended."""
    lines = wsecho.closes(before + 1)
    assert len(lines) > before, lines
    return lines[before]


@pytest.mark.parametrize("bad", CORPUS)
def test_invalid_client_frame_closes_that_tunnel_only(
    proxy: Lameduck, wsecho: WsEcho, bystander: ClientConnection, bad: bytes,
) -> None:
    before = len(wsecho.closes(len(wsecho.lines)))
    sock = _raw_upgrade(proxy.port)
    sock.sendall(masked(0x81, b"first"))  # a valid frame first: the tunnel relays
    assert _read_frame(sock) == (1, b"first")
    sock.sendall(bad)
    opcode, payload = _read_frame(sock)
    assert opcode == 8 and struct.unpack(">H", payload[:2])[0] == 1002, payload
    sock.settimeout(5)
    with pytest.raises((EOFError, ConnectionResetError, socket.timeout)):
        while True:  # nothing but the end after the close (bounded by the timeout)
            _read_frame(sock)
    sock.close()
    assert upstream_close(wsecho, before) == "closed 1001"
    bystander.send("still here")
    assert bystander.recv(timeout=5) == "still here"


def test_valid_close_codes_pass(proxy: Lameduck, wsecho: WsEcho) -> None:
    """The control: a registered and a private-use code close normally, relayed as sent."""
    for code in (1000, 4000):
        before = len(wsecho.closes(len(wsecho.lines)))
        sock = _raw_upgrade(proxy.port)
        sock.sendall(close(code, b"bye"))
        opcode, payload = _read_frame(sock)
        assert opcode == 8 and struct.unpack(">H", payload[:2])[0] == code
        sock.close()
        assert upstream_close(wsecho, before) == f"closed {code} bye"
    assert wait_until(lambda: proxy.stat("http.ingress.downstream_cx_upgrades_active") <= 1)
