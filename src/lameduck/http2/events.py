"""What ``H2Server.receive`` and ``H2Client.receive`` report. ``RequestReceived`` and
``HeadersTooLarge`` are the server's, ``ResponseReceived`` the client's; the rest (data,
trailers, resets, windows, GOAWAY, connection errors) mean the same on either side, about the
peer's half of the stream.

Small classes with a field per attribute, compared and shown by their fields (as the
NamedTuples they were, for tests and logs). Not NamedTuples: compiled by mypyc, a native
class is built by a direct call, where a NamedTuple's ``__new__`` is interpreted Python (and
``tuple.__new__`` from compiled code a method lookup and a generic call: ~1,500 instructions
more per request head or DATA frame).

There is no StreamEnded event: the shell knows a stream is finished when it has seen the
peer's end (``end_stream`` on a head/data/trailers event) and has sent its own end, or on
``StreamReset``; ``open_streams`` counts what is still open on the wire (including output
held back by flow control)."""

from __future__ import annotations

from typing import ClassVar

from .frames import ErrorCode


class _Fields:
    """Equality and repr by the fields named in ``_fields``, in order."""

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and isinstance(other, _Fields)
                and self._values() == other._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={value!r}"
                          for name, value in zip(self._fields, self._values(), strict=True))
        return f"{type(self).__name__}({shown})"


class RequestReceived(_Fields):
    """A well-formed request head. ``headers`` are the regular fields in order (cookie crumbs
    joined into one field, RFC 9113 §8.2.3); ``protocol`` is RFC 8441's ``:protocol``."""

    __slots__ = ("authority", "end_stream", "headers", "method", "path", "protocol", "scheme",
                 "stream_id")
    _fields = ("stream_id", "method", "scheme", "authority", "path", "protocol", "headers",
               "end_stream")

    def __init__(self, stream_id: int, method: bytes, scheme: bytes | None,
                 authority: bytes | None, path: bytes | None, protocol: bytes | None,
                 headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        self.stream_id = stream_id
        self.method = method
        self.scheme = scheme
        self.authority = authority
        self.path = path
        self.protocol = protocol
        self.headers = headers
        self.end_stream = end_stream


class ResponseReceived(_Fields):
    """A well-formed response head (client side). ``headers`` are the regular fields in
    order. ``status`` < 200 is an interim response (``end_stream`` False): any number may
    come before the final one."""

    __slots__ = ("end_stream", "headers", "status", "stream_id")
    _fields = ("stream_id", "status", "headers", "end_stream")

    def __init__(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]],
                 end_stream: bool) -> None:
        self.stream_id = stream_id
        self.status = status
        self.headers = headers
        self.end_stream = end_stream


class HeadersTooLarge(_Fields):
    """The decoded header list exceeded max_header_list_size: answer 431 with end_stream.
    Any request body is discarded here, and the stream reset with NO_ERROR once the answer is
    out if the client is still sending (RFC 9113 §8.1)."""

    __slots__ = ("end_stream", "stream_id")
    _fields = ("stream_id", "end_stream")

    def __init__(self, stream_id: int, end_stream: bool) -> None:
        self.stream_id = stream_id
        self.end_stream = end_stream


class DataReceived(_Fields):
    """Body bytes (a request's on the server, a response's on the client). Acknowledge
    ``flow_len`` (payload + padding) with ``acknowledge_received_data`` once consumed,
    forwarded or dropped: the windows reopen only then."""

    __slots__ = ("data", "end_stream", "flow_len", "stream_id")
    _fields = ("stream_id", "data", "flow_len", "end_stream")

    def __init__(self, stream_id: int, data: bytes, flow_len: int, end_stream: bool) -> None:
        self.stream_id = stream_id
        self.data = data
        self.flow_len = flow_len
        self.end_stream = end_stream


class TrailersReceived(_Fields):
    __slots__ = ("headers", "stream_id")
    _fields = ("stream_id", "headers")

    def __init__(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.stream_id = stream_id
        self.headers = headers


class StreamReset(_Fields):
    """The peer reset the stream, or we did because it broke a rule on it: forget it. On the
    client, REFUSED_STREAM (sent, or implied by a GOAWAY below the stream) means the server
    did not process the request: safe to retry (RFC 9113 §8.7)."""

    __slots__ = ("code", "stream_id")
    _fields = ("stream_id", "code")

    def __init__(self, stream_id: int, code: ErrorCode | int) -> None:
        self.stream_id = stream_id
        self.code = code


class WindowOpened(_Fields):
    """Output held back by flow control on this stream is all sent: resume its source (the
    upstream's response on the server, the downstream's request body on the client)."""

    __slots__ = ("stream_id",)
    _fields = ("stream_id",)

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id


class GoAwayReceived(_Fields):
    __slots__ = ("code", "last_stream_id")
    _fields = ("last_stream_id", "code")

    def __init__(self, last_stream_id: int, code: ErrorCode | int) -> None:
        self.last_stream_id = last_stream_id
        self.code = code


class ConnectionError(_Fields):
    """We sent GOAWAY(code): flush ``data_to_send()`` and close the socket."""

    __slots__ = ("code", "reason")
    _fields = ("code", "reason")

    def __init__(self, code: ErrorCode, reason: str) -> None:
        self.code = code
        self.reason = reason


Event = (RequestReceived | ResponseReceived | HeadersTooLarge | DataReceived | TrailersReceived
         | StreamReset | WindowOpened | GoAwayReceived | ConnectionError)
