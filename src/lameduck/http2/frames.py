"""HTTP/2 frame layout (RFC 9113 §4.1, §6): type and flag numbers, error codes, and the
builders for the frames the server writes. Frames are parsed in ``connection.py`` straight from
the bytes read; nothing here allocates per frame beyond the bytes it returns."""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Final

# Frame types (RFC 9113 §6).
DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

# Flags.
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# Settings identifiers (RFC 9113 §6.5.2, RFC 8441 §3).
SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6
SETTINGS_ENABLE_CONNECT_PROTOCOL: Final = 0x8

DEFAULT_WINDOW: Final = 65535
DEFAULT_MAX_FRAME: Final = 16384
MAX_FRAME_LIMIT: Final = (1 << 24) - 1
MAX_WINDOW: Final = (1 << 31) - 1


class ErrorCode(IntEnum):
    """RFC 9113 §7."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


_CODES: Final = {int(c): c for c in ErrorCode}


def error_code(value: int) -> ErrorCode | int:
    """The enum member for a known code; unknown codes stay ints (RFC 9113 §7: no special
    behaviour for them)."""
    return _CODES.get(value, value)


# The 9-octet header: a 24-bit length as (high byte, low 16 bits), type, flags, stream id.
HEADER: Final = struct.Struct(">BHBBL")
pack_header: Final = HEADER.pack
U32: Final = struct.Struct(">L")
TWO_U32: Final = struct.Struct(">LL")
SETTING: Final = struct.Struct(">HL")


def frame_header(length: int, ftype: int, flags: int, stream_id: int) -> bytes:
    return pack_header(length >> 16, length & 0xFFFF, ftype, flags, stream_id)


# The first five octets of a frame header (length, type, flags; RFC 9113 §4.1) of the frames a
# response is made of, by payload length below SHORT: the stream id's four octets follow
# (``stream_id_octets``, once per stream). A tuple index per frame instead of a struct call.
SHORT: Final = 256


def _prefixes(ftype: int, flags: int) -> tuple[bytes, ...]:
    return tuple(bytes((0, 0, n, ftype, flags)) for n in range(SHORT))


DATA_PREFIX: Final = _prefixes(DATA, 0)
DATA_END_PREFIX: Final = _prefixes(DATA, END_STREAM)
HEADERS_PREFIX: Final = _prefixes(HEADERS, END_HEADERS)
HEADERS_END_PREFIX: Final = _prefixes(HEADERS, END_HEADERS | END_STREAM)


# The stream id's octets below 2^16 (a connection's first 32,768 client streams) as two table
# entries joined, where int.to_bytes is a method call into the interpreter.
_HIGH: Final = tuple(bytes((0, 0, i)) for i in range(256))
_LOW: Final = tuple(bytes((i,)) for i in range(256))


def stream_id_octets(stream_id: int) -> bytes:
    if stream_id < 0x10000:
        return _HIGH[stream_id >> 8] + _LOW[stream_id & 0xFF]
    return stream_id.to_bytes(4, "big")


def settings_frame(settings: list[tuple[int, int]]) -> bytes:
    payload = b"".join(SETTING.pack(k, v) for k, v in settings)
    return frame_header(len(payload), SETTINGS, 0, 0) + payload


SETTINGS_ACK: Final = frame_header(0, SETTINGS, ACK, 0)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame_header(4, WINDOW_UPDATE, 0, stream_id) + U32.pack(increment)


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame_header(4, RST_STREAM, 0, stream_id) + U32.pack(code)


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return (frame_header(8 + len(debug), GOAWAY, 0, 0)
            + TWO_U32.pack(last_stream_id, code) + debug)


def ping_ack(payload: bytes) -> bytes:
    return frame_header(8, PING, ACK, 0) + payload
