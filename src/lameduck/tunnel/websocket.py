"""A sans-IO WebSocket (RFC 6455) frame tracker for a relay that never re-frames.

After the 101 (or the 2xx to an extended CONNECT, RFC 8441) the proxy copies bytes both ways as
they come. To drain a WebSocket politely it must put a close frame into a direction only where a
frame of that direction ends, and it must see the peers' close frames and any invalid frame. So
each direction gets a ``FrameTracker``: fed the relayed bytes in any chunking, it walks the frame
headers and skips payloads by length arithmetic (O(1) per frame, whatever the payload size). It
keeps at most one split header (<= 14 bytes) and one close frame's payload (<= 125 bytes, to read
its code); data payloads are never buffered, and text is not checked for UTF-8 (that would cost
a pass over every payload; the endpoints check it).

Rules kept (RFC 6455 §5): client-to-server frames are masked, server-to-client frames are not;
RSV bits are zero unless an extension says so (RSV1 on the first frame of a data message when
permessage-deflate, RFC 7692, was negotiated); opcodes are 0-2 and 8-10; control frames are
unfragmented and carry <= 125 bytes; continuations follow a non-FIN data frame and a new data
message waits for the FIN of the previous one; a 64-bit length has its top bit clear; a close
payload is empty, or a valid code and a UTF-8 reason. Not enforced (a relay can be lenient where
the endpoints are strict): minimal length encoding, frames after a close.
"""

from __future__ import annotations

import base64
import hashlib
import os

GOING_AWAY = 1001
PROTOCOL_ERROR = 1002
NO_STATUS = 1005  # what an empty close payload means (RFC 6455 §7.1.5); never sent on the wire

OP_CONT, OP_TEXT, OP_BINARY = 0x0, 0x1, 0x2
OP_CLOSE, OP_PING, OP_PONG = 0x8, 0x9, 0xA

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 §1.3

Bytes = bytes | bytearray | memoryview


def valid_close_code(code: int) -> bool:
    """Codes a peer may send: RFC 6455 §7.4.1, the IANA additions 1012-1014, and 3000-4999."""
    return 1000 <= code <= 1003 or 1007 <= code <= 1014 or 3000 <= code <= 4999


def apply_mask(payload: Bytes, key: Bytes) -> bytes:
    """XOR with the 4-byte key, as one big-int operation (no per-byte loop); for small payloads."""
    n = len(payload)
    if n == 0:
        return b""
    stream = (bytes(key) * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")


def close_frame(code: int, reason: bytes = b"", mask: bool = False,
                mask_key: bytes | None = None) -> bytes:
    """A close frame to inject; masked (fresh random key unless given) toward the upstream.

    Raises ValueError for what a peer would reject: a code it may not receive, a reason that is
    not UTF-8 or does not fit the 125-byte control payload.
    """
    if not valid_close_code(code):
        raise ValueError(f"{code} is not a close code that may be sent")
    reason.decode("utf-8")  # UnicodeDecodeError is a ValueError
    payload = code.to_bytes(2, "big") + reason
    if len(payload) > 125:
        raise ValueError(f"close reason too long: {len(reason)} bytes, at most 123")
    if not mask:  # mask_key is then ignored, so one call site serves both directions
        return bytes((0x80 | OP_CLOSE, len(payload))) + payload
    key = os.urandom(4) if mask_key is None else mask_key
    if len(key) != 4:
        raise ValueError(f"a mask key is 4 bytes, got {len(key)}")
    return bytes((0x80 | OP_CLOSE, 0x80 | len(payload))) + key + apply_mask(payload, key)


def accept_key(sec_websocket_key: bytes) -> bytes:
    """The Sec-WebSocket-Accept a 101 must carry for this Sec-WebSocket-Key (RFC 6455 §4.2.2)."""
    return base64.b64encode(hashlib.sha1(sec_websocket_key.strip() + GUID).digest())


class FrameTracker:
    """One direction of a relayed WebSocket: where frames end, closes, and the first bad frame.

    ``feed(data)`` returns how many bytes of ``data`` may be forwarded as they are: all of them,
    unless a frame is invalid; then ``error`` says why and the return value is the offset of the
    bad frame in ``data`` (0 if it began in an earlier chunk), and the tracker stops (later feeds
    return 0). ``feed(data, stop_at_boundary=True)`` stops right after the first frame that
    ends in ``data`` (at once, returning 0, if already at a boundary), so the relay can put a close
    frame there and feed the rest.
    """

    __slots__ = ("_close_buf", "_close_key", "_err_boundary", "_hdr", "_remaining",
                 "_rsv1_ok", "close_code", "close_seen", "error", "frames", "from_client",
                 "in_message")

    def __init__(self, from_client: bool, rsv1_allowed: bool = False) -> None:
        self.from_client = from_client
        self._rsv1_ok = rsv1_allowed
        self._hdr = b""  # a header split across chunks (< 14 bytes)
        self._remaining = 0  # payload bytes of the current frame still to come
        self._close_buf: bytearray | None = None  # the payload of a close frame in progress
        self._close_key: bytes | None = None
        self._err_boundary = False
        self.in_message = False
        self.close_seen = False
        self.close_code: int | None = None
        self.error: str | None = None
        self.frames = 0

    @property
    def at_boundary(self) -> bool:
        """Whether the bytes forwarded so far end where a frame ends: a close may go here.

        After an error: whether the bad frame began in the chunk that revealed it, so nothing of
        it was forwarded (else its receiver holds part of a frame and no close can follow).
        """
        if self.error is not None:
            return self._err_boundary
        return not self._hdr and self._remaining == 0

    def feed(self, data: Bytes, stop_at_boundary: bool = False) -> int:
        """Track ``data``; return how many of its bytes may be forwarded (see the class doc)."""
        if self.error is not None:
            return 0
        if stop_at_boundary and not self._hdr and self._remaining == 0:
            return 0
        n = len(data)
        pos = 0
        start = -1  # where the current frame began in data; -1: in an earlier chunk
        while pos < n:
            rem = self._remaining
            if rem == 0:  # a header: the usual case parses straight from data
                start = pos - len(self._hdr)
                if self._hdr:
                    buf = self._hdr + bytes(data[pos:pos + 14 - len(self._hdr)])
                    h = self._header(buf, 0, len(buf))
                    if h == 0:
                        self._hdr = buf
                        return n
                    if h > 0:
                        pos += h - len(self._hdr)
                        self._hdr = b""
                else:
                    h = self._header(data, pos, n)
                    if h == 0:
                        self._hdr = bytes(data[pos:])
                        return n
                    pos += h
                if h < 0:
                    return self._fail(start)
                if self._remaining:
                    continue
            else:  # payload: skip it by arithmetic; only a close frame's payload is kept
                take = min(rem, n - pos)
                if self._close_buf is not None:
                    self._close_buf += data[pos:pos + take]
                pos += take
                self._remaining = rem - take
                if self._remaining:
                    return n
            if self._close_buf is not None and not self._end_close():
                return self._fail(start)
            self.frames += 1
            if stop_at_boundary:
                return pos
        return n

    def _fail(self, start: int) -> int:
        self._err_boundary = start >= 0
        return max(start, 0)

    def _header(self, buf: Bytes, off: int, end: int) -> int:
        """Check and take the header at ``buf[off:]``: its length, 0 if incomplete, -1 if bad."""
        if end - off < 2:
            return 0
        b0 = buf[off]
        b1 = buf[off + 1]
        opcode = b0 & 0x0F
        fin = b0 & 0x80
        length = b1 & 0x7F
        masked = b1 & 0x80
        error = self._check(b0 & 0x70, opcode, fin, masked, length)
        if error is not None:
            self.error = error
            return -1
        h = (2 if length < 126 else 4 if length == 126 else 10) + (4 if masked else 0)
        if end - off < h:
            return 0
        if length == 126:
            length = (buf[off + 2] << 8) | buf[off + 3]
        elif length == 127:
            length = int.from_bytes(buf[off + 2:off + 10], "big")
            if length >> 63:
                self.error = "64-bit payload length with the most significant bit set"
                return -1
        if opcode == OP_CLOSE:
            self._close_buf = bytearray()
            self._close_key = bytes(buf[off + h - 4:off + h]) if masked else None
        elif opcode < OP_CLOSE:
            self.in_message = not fin
        self._remaining = length
        return h

    def _check(self, rsv: int, opcode: int, fin: int, masked: int, length: int) -> str | None:
        """Why a frame with these first two bytes is invalid here, or None (pure)."""
        if rsv and not (rsv == 0x40 and self._rsv1_ok and opcode in (OP_TEXT, OP_BINARY)):
            return f"reserved bits 0x{rsv:02x} set without an extension that defines them"
        if opcode >= OP_CLOSE:
            if opcode > OP_PONG:
                return f"unknown opcode 0x{opcode:x}"
            if not fin:
                return "fragmented control frame"
            if length > 125:
                return "control frame longer than 125 bytes"
        elif opcode > OP_BINARY:
            return f"unknown opcode 0x{opcode:x}"
        elif opcode == OP_CONT:
            if not self.in_message:
                return "continuation frame without a message in progress"
        elif self.in_message:
            return "new data frame inside a fragmented message"
        if bool(masked) is not self.from_client:
            return "unmasked frame from the client" if self.from_client else \
                "masked frame from the server"
        return None

    def _end_close(self) -> bool:
        """Read the code and reason of the close frame that just ended; False if invalid."""
        assert self._close_buf is not None
        payload = bytes(self._close_buf)
        self._close_buf = None
        if self._close_key is not None:
            payload = apply_mask(payload, self._close_key)
        if not payload:
            code = NO_STATUS
        elif len(payload) == 1:
            self.error = "close payload of 1 byte"
            return False
        else:
            code = int.from_bytes(payload[:2], "big")
            if not valid_close_code(code):
                self.error = f"invalid close code {code}"
                return False
            try:
                payload[2:].decode("utf-8")
            except UnicodeDecodeError:
                self.error = "close reason is not valid UTF-8"
                return False
        self.close_seen = True
        self.close_code = code
        return True
