"""A TLS listener's layer (lameduck.proxy.tlsstream.TlsStream) with the listener's own server
context, against Python's ssl client over memory BIOs, its socket a recording stand-in: the
handshake and ALPN, records both ways (several in one read, one split over reads), close_notify
both ways, a failed handshake. The real sockets are tests/integration/test_tls_stream.py's."""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme

from lameduck.config import ListenerConfig
from lameduck.listeners.tls import server_context
from lameduck.proxy.tlsstream import TlsStream


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    d = tmp_path_factory.mktemp("tls")
    cert_pem, key_pem = d / "cert.pem", d / "key.pem"
    cert.private_key_pem.write_to_path(str(key_pem))
    cert_pem.write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    return ca, cert_pem, key_pem


class Socket:
    """The plain transport under the stream: what it was given to send, and how it ended."""

    def __init__(self) -> None:
        self.sent = bytearray()
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closed and not self.aborted
        self.sent += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True
        self.sent.clear()  # an abort drops what was not sent yet

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 5555) if name == "peername" else default


class Codec:
    """What the HTTP codec is told."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.data: list[bytes] = []
        self.eof = 0
        self.lost: list[object] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool:
        self.eof += 1
        return True  # TLS has no half-close: the stream closes anyway

    def connection_lost(self, exc: object) -> None:
        self.lost.append(exc)


class Pair:
    """A client SSLObject and a TlsStream on the listener's context, bytes moved by hand."""

    def __init__(self, tls: tuple[trustme.CA, Path, Path], alpn: list[str]) -> None:
        ca, cert, key = tls
        cfg = ListenerConfig(name="t", address="127.0.0.1:0",
                             routes=[{"prefix": "/", "cluster": "a"}],
                             tls={"certificate": str(cert), "key": str(key),
                                  "alpn": ["h2", "http/1.1"]})
        sctx = server_context(cfg)
        assert sctx is not None
        cctx = ssl.create_default_context()
        ca.configure_trust(cctx)
        cctx.set_alpn_protocols(alpn)
        self.c_in, self.c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.client = cctx.wrap_bio(self.c_in, self.c_out, server_hostname="127.0.0.1")
        self.sock = Socket()
        self.done: list[BaseException | None] = []
        self.stream = TlsStream(self.sock, sctx,  # type: ignore[arg-type]
                                lambda s, exc: self.done.append(exc))
        self.codec = Codec()

    def to_server(self, data: bytes | None = None) -> None:
        self.stream.data_received(self.c_out.read() if data is None else data)

    def to_client(self) -> None:
        self.c_in.write(bytes(self.sock.sent))
        self.sock.sent.clear()

    def handshake(self) -> None:
        for _ in range(4):  # client hello, server flight, client finished
            with contextlib.suppress(ssl.SSLWantReadError):
                self.client.do_handshake()
            if self.c_out.pending:
                self.to_server()
            self.to_client()
            if self.done:
                break
        assert self.done == [None]
        self.client.do_handshake()
        self.stream.start(self.codec)  # type: ignore[arg-type]
        assert self.codec.transport is self.stream

    def client_reads(self) -> tuple[bytes, bool]:
        """What the client reads, and whether it read a close_notify after it."""
        self.to_client()
        out = b""
        with contextlib.suppress(ssl.SSLWantReadError):
            while True:
                chunk = self.client.read(65536)
                if not chunk:
                    return out, True
                out += chunk
        return out, False


def test_handshake_alpn_and_records_both_ways(tls) -> None:
    p = Pair(tls, ["h2", "http/1.1"])
    p.handshake()
    assert p.stream.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
    assert p.stream.get_extra_info("peername") == ("127.0.0.1", 5555)
    # two records in one read: one data_received
    p.client.write(b"GET /a HTTP/1.1\r\n\r\n")
    p.client.write(b"GET /b HTTP/1.1\r\n\r\n")
    p.to_server()
    assert p.codec.data == [b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n"]
    # one record over three reads: given once it is whole
    p.client.write(b"GET /c HTTP/1.1\r\n\r\n")
    record = p.c_out.read()
    for part in (record[:3], record[3:20], record[20:]):
        p.to_server(part)
    assert p.codec.data[1:] == [b"GET /c HTTP/1.1\r\n\r\n"]
    # a record larger than the read that brought the rest of it
    big = bytes(range(256)) * 60  # 15,360 bytes: one record
    p.client.write(big)
    record = p.c_out.read()
    p.to_server(record[:-10])
    reads = 0
    c_read = p.stream.c_read

    def counted(n: int) -> bytes:
        nonlocal reads
        reads += 1
        return c_read(n)

    p.stream.c_read = counted
    p.to_server(record[-10:])
    assert b"".join(p.codec.data[2:]) == big
    assert reads == 2  # one sized to the 10 bytes that came, one for the rest of the record
    # a response: one write, its records sent at once
    p.stream.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    assert p.client_reads() == (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", False)


def test_a_client_close_notify_is_the_end_of_the_stream(tls) -> None:
    p = Pair(tls, ["http/1.1"])
    p.handshake()
    assert p.stream.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
    p.client.write(b"GET / HTTP/1.1\r\n\r\n")
    with contextlib.suppress(ssl.SSLWantReadError):
        p.client.unwrap()  # close_notify after the request, in the same read
    p.to_server()
    assert p.codec.data == [b"GET / HTTP/1.1\r\n\r\n"]
    assert p.codec.eof == 1 and p.sock.closed
    p.to_client()
    p.client.unwrap()  # the server's close_notify came: the shutdown completes
    p.stream.write(b"late")  # a write after the close goes nowhere
    assert not p.sock.sent


def test_a_close_sends_close_notify_then_closes_the_socket(tls) -> None:
    p = Pair(tls, ["http/1.1"])
    p.handshake()
    p.stream.write(b"bye")
    p.stream.close()
    assert p.sock.closed and p.stream.is_closing()
    assert p.client_reads() == (b"bye", True)  # then close_notify
    p.stream.close()  # once
    p.stream.connection_lost(None)
    assert p.codec.lost == [None]


def test_a_failed_handshake_is_reported_and_its_alert_sent_before_the_close(tls) -> None:
    p = Pair(tls, ["http/1.1"])
    p.to_server(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # no TLS at all: no alert either
    assert len(p.done) == 1 and isinstance(p.done[0], ssl.SSLError)
    assert p.codec.transport is None
    assert p.sock.closed and not p.sock.aborted
    # a TLS 1.2 ClientHello offering only an RSA suite, for the listener's ECDSA certificate
    p = Pair(tls, ["http/1.1"])
    ca = tls[0]
    cctx = ssl.create_default_context()
    ca.configure_trust(cctx)
    cctx.maximum_version = ssl.TLSVersion.TLSv1_2
    cctx.set_ciphers("ECDHE-RSA-AES128-GCM-SHA256")
    c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = cctx.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    p.to_server(c_out.read())
    assert len(p.done) == 1 and "NO_SHARED_CIPHER" in str(p.done[0])
    # a fatal alert record (RFC 8446 §6: content type 21), then a close, not an abort
    assert p.sock.sent[:1] == b"\x15" and p.sock.closed and not p.sock.aborted
    assert p.stream.is_closing()
    p.stream.close()  # what the listener does after a failed handshake: the alert stays
    assert p.sock.sent[:1] == b"\x15" and not p.sock.aborted


def test_the_server_context_refuses_renegotiation(tls) -> None:
    """TLS 1.2 renegotiation is off (RFC 9113 §9.2.1): the context says so whatever the
    OpenSSL's default (3.0 refuses a client's unless told to allow it; 1.1.1 allows it)."""
    p = Pair(tls, ["h2"])
    assert p.stream.sslobj.context.options & ssl.OP_NO_RENEGOTIATION
