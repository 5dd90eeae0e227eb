"""What lameduck answers itself on a gRPC call: a status the client's retry policy can act on."""

from __future__ import annotations

import pytest

from lameduck.proxy.local import (
    GRPC_DEADLINE_EXCEEDED,
    GRPC_INTERNAL,
    GRPC_UNAVAILABLE,
    GRPC_UNIMPLEMENTED,
    grpc_fields,
    grpc_local_reply,
    grpc_status,
    is_grpc,
)


@pytest.mark.parametrize(("ct", "want"), [
    (b"application/grpc", True), (b"application/grpc+proto", True),
    (b"application/grpc;charset=utf-8", True), (b"APPLICATION/GRPC", True),
    (b"application/grpc-web", False), (b"application/grpcx", False), (b"text/plain", False),
])
def test_is_grpc(ct: bytes, want: bool) -> None:
    assert is_grpc(ct) is want


@pytest.mark.parametrize(("http", "grpc"), [
    (503, GRPC_UNAVAILABLE), (502, GRPC_UNAVAILABLE), (504, GRPC_DEADLINE_EXCEEDED),
    (404, GRPC_UNIMPLEMENTED), (501, GRPC_UNIMPLEMENTED), (400, GRPC_INTERNAL),
])
def test_status_mapping(http: int, grpc: int) -> None:
    assert grpc_status(http) == grpc


def test_trailers_only_reply_and_percent_encoded_message() -> None:
    assert grpc_local_reply(503, b"no healthy upstream\n") == [
        (b"content-type", b"application/grpc"), (b"grpc-status", b"14"),
        (b"grpc-message", b"no healthy upstream")]
    assert grpc_fields(14, b"100% gone\xe2\x80\x94") == [
        (b"grpc-status", b"14"), (b"grpc-message", b"100%25 gone%E2%80%94")]
