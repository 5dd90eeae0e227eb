"""TLS on an accepted connection: ``ssl``'s SSLObject over a pair of MemoryBIOs, driven here as
the plain transport's protocol, and the transport the HTTP codec writes to.

What the loop's own TLS layer (uvloop's SSLProtocol, ``loop.start_tls``) does per record, less
what a server codec does not need: it reads each record into a 256 KiB buffer (one allocation
and a shrink per read) and asks ``SSLObject.pending()`` (a GIL release) after it; each of its
reads and writes reads the BIOs' ``pending`` twice for its flow control, copies the context and
queues the data. Here a read is one ``SSL_read`` sized to what arrived (and a second for the
rest of a record larger than that), a write one
``SSL_write`` and one write of its records to the socket, as HAProxy does per request (one
SSL_read, one SSL_write). Flow control is the socket's: its pause_writing and resume_writing
go to the codec as they come.

The handshake runs here too (``TlsAccept`` in lameduck.listeners.tls times it and picks the
codec by ALPN). A close sends close_notify (RFC 8446 §6.1) and closes the socket once what is
buffered is sent, without waiting for the client's (§6.1 lets the closer not wait); the
client's close_notify reads as the end of its stream (the codec's ``eof_received``); a TCP FIN
without one (a truncation, §6.1) ends the connection without it, as uvloop's layer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from typing import Any, Final

RECORD: Final = 16384  # a TLS record's plaintext at most (RFC 8446 §5.1)
SLACK: Final = 256  # read room beyond the ciphertext that arrived

HANDSHAKE: Final = 0
OPEN: Final = 1
CLOSED: Final = 2  # closed here, or the socket is gone


class TlsStream(asyncio.Protocol):
    """One TLS connection: the protocol of its socket, and the transport of its codec."""

    def __init__(self, raw: asyncio.Transport, context: ssl.SSLContext,
                 handshaken: Callable[[TlsStream, BaseException | None], None]) -> None:
        self.raw = raw
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.sslobj: ssl.SSLObject = context.wrap_bio(self.incoming, self.outgoing,
                                                      server_side=True)
        c: Any = self.sslobj._sslobj  # type: ignore[attr-defined]  # the _ssl object itself
        # The C methods, called directly: no frame of ssl.py per record.
        self.c_read: Callable[[int], bytes] = c.read
        self.c_write: Callable[[bytes], int] = c.write
        self.bio_write: Callable[[bytes], int] = self.incoming.write
        self.bio_read: Callable[[], bytes] = self.outgoing.read
        self.handshaken: Callable[[TlsStream, BaseException | None], None] | None = handshaken
        self.app: Any = None
        self.state = HANDSHAKE
        self.eof = False  # the client's close_notify was read

    # -- the socket's protocol ------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self.bio_write(data)
        if self.state == OPEN:
            self._read(len(data))
        elif self.state == HANDSHAKE:
            self._handshake()

    def _handshake(self) -> None:
        try:
            self.sslobj.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except Exception as e:  # a failed handshake: its alert goes out, then the FIN
            self._flush()
            self.state = CLOSED
            self.raw.close()  # sends what is buffered first (an abort would drop the alert)
            self._handshake_done(e)
            return
        self._flush()
        self.state = OPEN
        self._handshake_done(None)

    def _handshake_done(self, exc: BaseException | None) -> None:
        cb = self.handshaken
        self.handshaken = None
        if cb is not None:
            cb(self, exc)

    def start(self, app: asyncio.Protocol) -> None:
        """The codec takes the connection (after the handshake); records that came with the
        client's Finished (TLS 1.3 requests sent right behind it) are read at once."""
        self.app = app
        app.connection_made(self)  # type: ignore[arg-type]
        if self.state == OPEN:  # (what OpenSSL may hold already is read too: one try)
            self._read(self.incoming.pending)

    def _read(self, size: int) -> None:
        """Every whole record read, given to the codec in one ``data_received``. The first
        ``SSL_read`` is sized to what arrived (a request's record is small: no 16 KiB buffer
        to allocate and shrink); one that fills it read a larger record, whose last piece
        came now: the next takes up to a whole record, not another piece of this size."""
        n = (size if size < RECORD else RECORD) + SLACK
        first = b""
        more: list[bytes] | None = None
        c_read = self.c_read
        try:
            while True:
                chunk = c_read(n)
                if not chunk:  # close_notify (SSL_read's zero return)
                    self.eof = True
                    break
                if not first:
                    first = chunk
                elif more is None:
                    more = [first, chunk]
                else:
                    more.append(chunk)
                if len(chunk) == n:
                    n = RECORD + SLACK  # the rest of a record larger than n, in one read
                elif not self.incoming.pending:
                    break  # the last record read whole: nothing is left to decrypt
        except ssl.SSLWantReadError:
            pass  # part of a record: the rest comes with the next read
        except ssl.SSLError as e:
            self._fatal(e)
            return
        if self.outgoing.pending:  # a key update's records, or a refused renegotiation's alert
            self._flush()
        app = self.app
        if first and app is not None:
            app.data_received(first if more is None else b"".join(more))
        if self.eof and self.state == OPEN:
            if self.app is not None:
                self.app.eof_received()  # its answer does not matter: TLS has no half-close
            self.close()

    def eof_received(self) -> bool:
        """A FIN: during the handshake it fails; after it, one without close_notify is a
        truncation (RFC 8446 §6.1): the connection ends, the codec is not told of an end of
        stream (as uvloop's layer does)."""
        if self.state == HANDSHAKE:
            self._handshake_done(ConnectionResetError("EOF during the TLS handshake"))
        return False  # the socket closes: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = CLOSED
        if self.handshaken is not None:
            self._handshake_done(exc or ConnectionResetError("closed during the TLS handshake"))
        app = self.app
        if app is not None:
            self.app = None
            app.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.app is not None:
            self.app.pause_writing()

    def resume_writing(self) -> None:
        if self.app is not None:
            self.app.resume_writing()

    # -- the codec's transport -----------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.state != OPEN or not data:
            return
        try:
            self.c_write(data)  # never wants a read: the context refuses renegotiation
        except ssl.SSLError as e:
            self._fatal(e)
            return
        self.raw.write(self.bio_read())

    def writelines(self, list_of_data: list[bytes]) -> None:
        self.write(b"".join(list_of_data))

    def _flush(self) -> None:
        data = self.bio_read()
        if data:
            self.raw.write(data)

    def _fatal(self, exc: BaseException) -> None:
        self._flush()  # the alert, if any
        self.state = CLOSED
        self.raw.abort()

    def close(self) -> None:
        """close_notify, then the socket closes once what is buffered is sent."""
        if self.state == CLOSED:
            return
        if self.state == OPEN:
            # WantRead: the client's close_notify is not waited for
            with contextlib.suppress(ssl.SSLError, ValueError):
                self.sslobj.unwrap()
            self._flush()
        self.state = CLOSED
        self.raw.close()

    def abort(self) -> None:
        self.state = CLOSED
        self.raw.abort()

    def is_closing(self) -> bool:
        return self.state == CLOSED or self.raw.is_closing()

    def can_write_eof(self) -> bool:
        return False  # TLS has no half-close (RFC 8446 §6.1)

    def write_eof(self) -> None:
        raise NotImplementedError("TLS has no half-close")

    def pause_reading(self) -> None:
        self.raw.pause_reading()

    def resume_reading(self) -> None:
        self.raw.resume_reading()

    def get_write_buffer_size(self) -> int:
        return self.raw.get_write_buffer_size() + self.outgoing.pending

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.app = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.app  # type: ignore[no-any-return]

    def get_extra_info(self, name: str, default: object = None) -> object:
        """``ssl_object`` (asyncio's name for it), else the socket's: ``peername`` for the
        access log and the codecs, ``socket`` for a tunnel's reset."""
        if name == "ssl_object":
            return self.sslobj
        return self.raw.get_extra_info(name, default)
