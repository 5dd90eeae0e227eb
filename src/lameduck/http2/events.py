"""What ``H2Server.receive`` and ``H2Client.receive`` report. NamedTuples: one allocation
each, readable in tests. ``RequestReceived`` and ``HeadersTooLarge`` are the server's,
``ResponseReceived`` the client's; the rest (data, trailers, resets, windows, GOAWAY,
connection errors) mean the same on either side, about the peer's half of the stream.

There is no StreamEnded event: the shell knows a stream is finished when it has seen the
peer's end (``end_stream`` on a head/data/trailers event) and has sent its own end, or on
``StreamReset``; ``open_streams`` counts what is still open on the wire (including output
held back by flow control)."""

from __future__ import annotations

from typing import NamedTuple

from .frames import ErrorCode


class RequestReceived(NamedTuple):
    """A well-formed request head. ``headers`` are the regular fields in order (cookie crumbs
    joined into one field, RFC 9113 §8.2.3); ``protocol`` is RFC 8441's ``:protocol``."""

    stream_id: int
    method: bytes
    scheme: bytes | None
    authority: bytes | None
    path: bytes | None
    protocol: bytes | None
    headers: list[tuple[bytes, bytes]]
    end_stream: bool


class ResponseReceived(NamedTuple):
    """A well-formed response head (client side). ``headers`` are the regular fields in
    order. ``status`` < 200 is an interim response (``end_stream`` False): any number may
    come before the final one."""

    stream_id: int
    status: int
    headers: list[tuple[bytes, bytes]]
    end_stream: bool


class HeadersTooLarge(NamedTuple):
    """The decoded header list exceeded max_header_list_size: answer 431 with end_stream.
    Any request body is discarded here, and the stream reset with NO_ERROR once the answer is
    out if the client is still sending (RFC 9113 §8.1)."""

    stream_id: int
    end_stream: bool


class DataReceived(NamedTuple):
    """Body bytes (a request's on the server, a response's on the client). Acknowledge
    ``flow_len`` (payload + padding) with ``acknowledge_received_data`` once consumed,
    forwarded or dropped: the windows reopen only then."""

    stream_id: int
    data: bytes
    flow_len: int
    end_stream: bool


class TrailersReceived(NamedTuple):
    stream_id: int
    headers: list[tuple[bytes, bytes]]


class StreamReset(NamedTuple):
    """The peer reset the stream, or we did because it broke a rule on it: forget it. On the
    client, REFUSED_STREAM (sent, or implied by a GOAWAY below the stream) means the server
    did not process the request: safe to retry (RFC 9113 §8.7)."""

    stream_id: int
    code: ErrorCode | int


class WindowOpened(NamedTuple):
    """Output held back by flow control on this stream is all sent: resume its source (the
    upstream's response on the server, the downstream's request body on the client)."""

    stream_id: int


class GoAwayReceived(NamedTuple):
    last_stream_id: int
    code: ErrorCode | int


class ConnectionError(NamedTuple):
    """We sent GOAWAY(code): flush ``data_to_send()`` and close the socket."""

    code: ErrorCode
    reason: str


Event = (RequestReceived | ResponseReceived | HeadersTooLarge | DataReceived | TrailersReceived
         | StreamReset | WindowOpened | GoAwayReceived | ConnectionError)
