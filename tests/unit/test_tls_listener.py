"""listeners/tls.py: the server context's SSLObject class hands uvloop the ``_ssl`` object's own
C methods (no ssl.py forwarding frame per record) and still speaks TLS exactly as the stock
one: a handshake, records both ways, SSLWantReadError on an empty incoming BIO."""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path

import pytest
import trustme

from lameduck.config import ListenerConfig
from lameduck.listeners.tls import DirectSSLObject, server_context


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    d = tmp_path_factory.mktemp("tls")
    cert_pem, key_pem = d / "cert.pem", d / "key.pem"
    cert.private_key_pem.write_to_path(str(key_pem))
    cert_pem.write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
    return ca, cert_pem, key_pem


def _pump(src: ssl.MemoryBIO, dst: ssl.MemoryBIO) -> None:
    dst.write(src.read())


def test_server_context_uses_the_direct_object_and_talks_tls(tls):
    ca, cert, key = tls
    cfg = ListenerConfig(name="t", address="127.0.0.1:0", routes=[{"prefix": "/", "cluster": "a"}],
                         tls={"certificate": str(cert), "key": str(key), "alpn": ["http/1.1"]})
    sctx = server_context(cfg)
    assert sctx is not None and sctx.sslobject_class is DirectSSLObject
    cctx = ssl.create_default_context()
    ca.configure_trust(cctx)
    cctx.set_alpn_protocols(["http/1.1"])
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    server = sctx.wrap_bio(s_in, s_out, server_side=True)
    client = cctx.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    assert isinstance(server, DirectSSLObject)
    # what uvloop caches: the C methods themselves, not ssl.py's forwarding functions
    for name in ("read", "write", "pending"):
        assert type(getattr(server, name)).__name__ == "builtin_function_or_method"
    for _ in range(4):  # client hello, server flight, client finished
        for side in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        _pump(c_out, s_in)
        _pump(s_out, c_in)
    server.do_handshake()
    assert server.selected_alpn_protocol() == "http/1.1"
    with pytest.raises(ssl.SSLWantReadError):
        server.read(1024)
    client.write(b"GET / HTTP/1.1\r\n\r\n")
    _pump(c_out, s_in)
    assert server.pending() == 0
    assert server.read(256 * 1024) == b"GET / HTTP/1.1\r\n\r\n"
    buf = bytearray(64)
    assert server.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n") == 38
    _pump(s_out, c_in)
    assert client.read(64, buf) == 38 and bytes(buf[:12]) == b"HTTP/1.1 200"
