"""What an exchange and an upstream connection say to each other, whatever the protocol.

An exchange holds an ``UpstreamConn`` while its request is upstream — a whole HTTP/1.1
connection or one HTTP/2 stream on a shared one — and the connection reports back to the
exchange's ``ExchangeSink``. The codecs implement these; neither imports the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from mypy_extensions import mypyc_attr


class UpstreamError:
    """Why an upstream exchange failed: the status the client gets if nothing was sent yet."""

    CONNECT: Final = 503  # connect refused or timed out
    RESET: Final = 502  # reset or bad response before the response completed
    TIMEOUT: Final = 504  # the response not complete within the route timeout


# A message's fields, protocol-neutral: (name, value) as received (HTTP/1.1 keeps the name's
# case; HTTP/2's are lower-case), connection-specific ones already removed.
Fields = list[tuple[bytes, bytes]]


class ResponseTimeouts:
    """The two timeouts of one request upstream, both from the request's end: the route
    timeout (the response whole by ``deadline``; Envoy's route ``timeout``) and the per-try idle
    timeout (no upstream byte for ``idle``; Envoy's ``per_try_idle_timeout``). It decides and
    reports to the exchange; each codec keeps one timer at the moment ``start``/``expire`` give
    and says how to cut its request."""

    __slots__ = ("deadline", "idle", "last_byte")

    def __init__(self) -> None:
        self.deadline = 0.0  # 0: none (or the request is not sent whole yet)
        self.idle = 0.0  # 0: none
        self.last_byte = 0.0  # kept only with ``idle``

    def start(self, now: float, timeout: float, idle: float) -> float:
        """The request was sent whole: the first moment to check, 0 for none."""
        at = 0.0
        if timeout > 0:
            self.deadline = at = now + timeout
        if idle > 0:
            self.idle = idle
            self.last_byte = now
            if not at or now + idle < at:
                at = now + idle
        return at

    def touch(self, now: float) -> None:
        """An upstream byte arrived (a 1xx head included): the idle timeout starts again."""
        if self.idle:
            self.last_byte = now

    def expire(self, now: float, sink: ExchangeSink, head_seen: bool,
               cut: Callable[[], None]) -> float:
        """The codec's timer fired: if a timeout ended, ``cut`` the request upstream (the
        connection or the stream) and tell ``sink`` which, returning 0; else the next moment
        to check (0: none)."""
        deadline, idle = self.deadline, self.idle
        if deadline and now >= deadline:
            cut()
            sink.on_upstream_error(UpstreamError.TIMEOUT, head_seen)
            return 0.0
        if idle and now >= self.last_byte + idle:
            cut()
            sink.on_upstream_idle(head_seen)
            return 0.0
        if idle and (not deadline or self.last_byte + idle < deadline):
            return self.last_byte + idle
        return deadline


@mypyc_attr(allow_interpreted_subclasses=True)  # the tests' sinks
class ExchangeSink:
    """What an upstream connection reports to (the downstream exchange, which subclasses
    this): a native base class, so the codec's reports are direct calls, not by name."""

    # The response's fields are wanted even when its bytes go through whole (the access
    # log's %RESP()% reads them).
    wants_fields = False

    def on_informational(self, status: int, fields: Fields) -> None:
        raise NotImplementedError

    def on_response_head(self, status: int, fields: Fields, length: int | None,
                         chunked: bool) -> None:
        raise NotImplementedError

    def on_response_body(self, data: bytes) -> None:
        raise NotImplementedError

    def on_response_complete(self, trailers: list[tuple[bytes, bytes]] | None = None) -> None:
        """The response ended; ``trailers``: its trailer section, already filtered by
        ``proxy.fields.trailer_fields`` (None if it had none)."""
        raise NotImplementedError

    def on_upstream_error(self, status: int, after_head: bool, idle: bool = False) -> None:
        raise NotImplementedError

    def on_upstream_idle(self, after_head: bool) -> None:
        """No upstream byte for the route's ``per_try_idle_timeout``: the connection was cut."""
        raise NotImplementedError

    def on_upstream_refused(self) -> None:
        """HTTP/2 proved the request unprocessed (RFC 9113 §8.7): safe to send again."""
        raise NotImplementedError

    def on_whole_response(self, status: int, data: bytes, end: int,
                          fields: Fields | None) -> bool:
        """A whole plain HTTP/1.1 response (``data``, its head ending at ``end``); ``fields``:
        its fields, read when this sink's ``wants_fields`` or the request was HTTP/2."""
        raise NotImplementedError

    def on_upgrade(self, fields: Fields, upgrade: bytes, rest: bytes) -> bool:
        raise NotImplementedError

    def pause_request_body(self) -> None:
        raise NotImplementedError

    def resume_request_body(self) -> None:
        raise NotImplementedError

    def cork(self) -> None:
        raise NotImplementedError

    def uncork(self) -> None:
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)  # the TCP listener's, and the tests' upstreams
class UpstreamConn(asyncio.Protocol):
    """What an exchange holds while its request is upstream: an ``H1Upstream`` (a whole
    connection) or an HTTP/2 stream on a shared one (``http2.upstream``). A native base class,
    not a protocol: the exchange reads ``sink`` or ``alive`` and calls ``end`` directly, not
    by name."""

    def __init__(self, multiplexed: bool) -> None:
        self.sink: ExchangeSink | None = None
        self.alive = True
        self.read_paused = False
        self.got_bytes = False  # a response byte came: no retry from here on
        self.multiplexed = multiplexed  # a stream of a shared connection (HTTP/2)
        self.idle_since = 0.0  # kept by the pool

    @property
    def reusable(self) -> bool:
        """It may carry another request (the pool keeps it idle for one)."""
        raise NotImplementedError

    def start(self, sink: ExchangeSink, head: Any) -> None:
        """Send the request head: a ``proxy.message.RequestHead`` as admission prepared it
        (``Any`` here: imports flow from the proxy down to this layer, not back), formatted
        once by the upstream codec, HTTP/1.1 text or HTTP/2 HEADERS."""
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def end(self, trailers: list[tuple[bytes, bytes]] | None, timeout: float,
            idle_timeout: float) -> None:
        """The request was sent whole, with its trailer section if it had one. The timers
        start here, as Envoy's do: the route ``timeout`` until the response is complete, the
        ``per_try_idle_timeout`` between upstream bytes (0 = none)."""
        raise NotImplementedError

    def pause_reading(self) -> None:
        raise NotImplementedError

    def resume_reading(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def take_over(self) -> asyncio.Transport | None:
        """A 101 turned this connection into a tunnel: its socket, for the relay, and the
        connection is no longer the pool's (None for a stream of a shared connection)."""
        raise NotImplementedError

    def tunnel_closed(self) -> None:
        """The relay that took the socket over has ended: settle the pool's books."""
        raise NotImplementedError
