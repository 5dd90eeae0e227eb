"""Answers lameduck gives itself, the same on every protocol."""

from __future__ import annotations

from typing import Final

# On a 503 that another instance could serve now (no healthy upstream, going away): a client
# may try again after a second (RFC 9110 §10.2.3), by then on another endpoint.
RETRY_AFTER: Final = ((b"retry-after", b"1"),)
# The body of that 503 past the drain time, or at the shutdown deadline before any response
# byte went out (Envoy's drain answers "going away" too).
GOING_AWAY_BODY: Final = b"going away\n"
# A request body that stopped coming for request_body_timeout (nginx client_body_timeout): 408.
BODY_TIMEOUT_BODY: Final = b"request body timeout\n"

# What a codec sends for a request the shutdown deadline cut (``Exchange.deadline_cut``).
CUT_ANSWER: Final = 0  # 503 GOING_AWAY_BODY with RETRY_AFTER (booked by the exchange)
CUT_RESET: Final = 1  # its response had started: the client can only see a reset
CUT_STATUS: Final = 2  # a gRPC call's response had started: CUT_GRPC_TRAILERS end it
CUT_DROPPED: Final = 3  # nothing: it could not be answered (pipelined behind another)


TEXT: Final = b"text/plain; charset=utf-8"


def local_fields(body: bytes, extra: tuple[tuple[bytes, bytes], ...] = ()) -> list[
        tuple[bytes, bytes]]:
    """The fields of an answer from here on a multiplexed protocol (HTTP/2, HTTP/3): a
    plain-text body of known length, and ``extra`` (Retry-After)."""
    return [(b"content-type", TEXT), (b"content-length", b"%d" % len(body)), *extra]


def local_answer(status: int, body: bytes, extra: tuple[tuple[bytes, bytes], ...],
                 grpc: bool, is_head: bool) -> tuple[int, list[tuple[bytes, bytes]],
                                                     bytes | None]:
    """A local answer on a multiplexed protocol (HTTP/2, HTTP/3), as the status, fields and
    body to send; body None: the head ends the stream. A gRPC call gets a trailers-only
    response, HTTP 200 with the gRPC status saying why (counted as the HTTP status); a HEAD
    gets the head alone."""
    if grpc:
        return 200, grpc_local_reply(status, body), None
    if is_head:
        return status, local_fields(body, extra), None
    return status, local_fields(body, extra), body


# gRPC (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md): a request whose
# content-type starts with this is a call; what lameduck answers itself on it is a gRPC status,
# as Envoy does, so the client's retry policy sees the real cause instead of an HTTP status it
# maps to UNKNOWN or INTERNAL.
GRPC_CONTENT_TYPE: Final = b"application/grpc"
# https://grpc.github.io/grpc/core/md_doc_statuscodes.html
GRPC_DEADLINE_EXCEEDED: Final = 4
GRPC_UNIMPLEMENTED: Final = 12
GRPC_INTERNAL: Final = 13
GRPC_UNAVAILABLE: Final = 14


def is_grpc(content_type: bytes) -> bool:
    """``application/grpc``, ``application/grpc+proto``, ``application/grpc;...``."""
    return content_type[:16].lower() == GRPC_CONTENT_TYPE and content_type[16:17] in (
        b"", b"+", b";")


def grpc_status(http_status: int) -> int:
    """The gRPC status for an HTTP status lameduck answers with: unavailable for what another
    instance could serve (no upstream, connect error, reset, going away, cut), deadline
    exceeded for an upstream timeout, unimplemented for no route."""
    if http_status == 504:
        return GRPC_DEADLINE_EXCEEDED
    if http_status in (404, 501):
        return GRPC_UNIMPLEMENTED
    if http_status in (502, 503):
        return GRPC_UNAVAILABLE
    return GRPC_INTERNAL


def _percent(message: bytes) -> bytes:
    """grpc-message is percent-encoded: bytes outside 0x20-0x7E, and ``%``, as %XX."""
    return b"".join(bytes([c]) if 0x20 <= c <= 0x7E and c != 0x25 else b"%%%02X" % c
                    for c in message)


def grpc_fields(status: int, message: bytes) -> list[tuple[bytes, bytes]]:
    """``grpc-status`` and ``grpc-message`` (trailers, or a trailers-only response's head)."""
    return [(b"grpc-status", b"%d" % status), (b"grpc-message", _percent(message.strip()))]


def grpc_local_reply(http_status: int, message: bytes) -> list[tuple[bytes, bytes]]:
    """A trailers-only response (HTTP 200 and END_STREAM on its HEADERS) for a call lameduck
    answers itself."""
    return [(b"content-type", GRPC_CONTENT_TYPE),
            *grpc_fields(grpc_status(http_status), message)]


# A call cut at the shutdown deadline after its response began ends with a status the client
# can act on (UNAVAILABLE: try elsewhere), not a reset, where the protocol carries trailers.
CUT_GRPC_TRAILERS: Final = grpc_fields(GRPC_UNAVAILABLE, b"going away: cut at the drain deadline")
